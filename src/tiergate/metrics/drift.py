"""Agreement of one output with the FP32 reference's (or another tier's) same output.

Everything is computed in float64. SQNR follows onnxruntime's
`qdq_loss_debug.compute_signal_to_quantization_noice_ratio`:
20*log10(max(|ref|, eps) / max(|ref - out|, eps)) over the whole tensor.
"""

from __future__ import annotations

import math

import numpy as np

from tiergate.figures import OutputDrift  # noqa: F401 - re-exported (stdlib-only type)
from tiergate.metrics.accuracy import is_classifier, predictions


def _scipy_special():
    """scipy.special, imported on first use (it costs about a second at start-up)."""
    from scipy import special

    return special

EPS = float(np.finfo(float).eps)
PROB_EPS = 1e-12
PROB_SUM_TOLERANCE = 1e-3


def as_float64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array, dtype=np.float64)


def per_sample(array: np.ndarray) -> np.ndarray:
    array = as_float64(array)
    return array.reshape(len(array), -1)


def non_finite_count(array: np.ndarray) -> int:
    array = np.asarray(array)
    if not np.issubdtype(array.dtype, np.inexact):
        return 0
    return int(array.size - np.count_nonzero(np.isfinite(array)))


def abs_errors(ref: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.abs(as_float64(ref) - as_float64(out)).ravel()


def relative_l2(ref: np.ndarray, out: np.ndarray) -> float:
    ref64 = as_float64(ref)
    return float(np.linalg.norm(ref64 - as_float64(out)) / max(np.linalg.norm(ref64), EPS))


def sqnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """SQNR in dB; two identical outputs of zeros agree perfectly (inf: no noise, where EPS / EPS would say 0 dB)."""
    ref64 = as_float64(ref).ravel()
    noise = float(np.linalg.norm(ref64 - as_float64(out).ravel()))
    if noise == 0 and not np.any(ref64):
        return math.inf
    signal = max(float(np.linalg.norm(ref64)), EPS)
    noise = max(noise, EPS)
    ratio = signal / noise                 # NaN stays NaN; infinite noise gives -inf dB
    return 20.0 * math.log10(ratio) if ratio > 0 else (-math.inf if ratio == 0 else math.nan)


def cosine_per_sample(ref: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Cosine of each sample's flattened vectors; two zero vectors agree (1), one zero vector does not (0)."""
    a, b = per_sample(ref), per_sample(out)
    norm_a, norm_b = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    norms = norm_a * norm_b
    both_zero = (norm_a == 0) & (norm_b == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.einsum("ij,ij->i", a, b) / norms
    return np.where(both_zero, 1.0, np.where(norms == 0, 0.0, cos))


def top1_agreement(ref: np.ndarray, out: np.ndarray) -> float | None:
    if not is_classifier(ref):
        return None
    return float(np.mean(predictions(as_float64(ref)) == predictions(as_float64(out))))


def is_probability(ref: np.ndarray) -> bool:
    """Every sample's values lie in [0, 1] and sum to 1 along the last axis."""
    ref64 = as_float64(ref)
    if ref64.ndim < 2 or ref64.shape[-1] < 2 or not np.all(np.isfinite(ref64)):
        return False
    if ref64.min() < 0 or ref64.max() > 1:
        return False
    return bool(np.allclose(ref64.sum(axis=-1), 1.0, atol=PROB_SUM_TOLERANCE))


def kl_divergence(ref: np.ndarray, out: np.ndarray) -> float:
    """Mean over samples (and leading axes) of KL(ref || out) in nats, along the last axis.

    Both sides are clipped to [1e-12, 1] and renormalised first, so a quantized
    zero where the reference is positive gives a large, finite divergence.
    """
    p, q = (_normalised(x) for x in (ref, out))
    return float(np.mean(_scipy_special().rel_entr(p, q).sum(axis=-1)))


def _normalised(x: np.ndarray) -> np.ndarray:
    x = np.clip(as_float64(x), PROB_EPS, 1.0)
    return x / x.sum(axis=-1, keepdims=True)


def compare_outputs(ref: np.ndarray, out: np.ndarray) -> OutputDrift:
    """Every agreement metric of `out` against `ref` (same shape; first axis = sample)."""
    ref, out = np.asarray(ref), np.asarray(out)
    if ref.shape != out.shape:
        raise ValueError(f"shapes differ: {ref.shape} vs {out.shape}")
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):   # NaN/Inf outputs give NaN metrics
        return _compare(ref, out)


def _compare(ref: np.ndarray, out: np.ndarray) -> OutputDrift:
    non_finite = non_finite_count(out)
    ref, out = as_float64(ref), as_float64(out)     # once: each helper below would convert its own copy
    errors = abs_errors(ref, out)
    cos = cosine_per_sample(ref, out)
    return OutputDrift(
        n_samples=len(ref),
        non_finite=non_finite,
        max_abs_error=float(errors.max()) if errors.size else 0.0,
        p99_abs_error=float(np.percentile(errors, 99)) if errors.size else 0.0,
        relative_l2=relative_l2(ref, out),
        sqnr_db=sqnr_db(ref, out),
        cosine=float(cos.mean()) if cos.size else 1.0,
        cosine_min=float(cos.min()) if cos.size else 1.0,
        top1_agreement=top1_agreement(ref, out),
        kl_divergence=kl_divergence(ref, out) if is_probability(ref) else None,
    )


def shared_drift(ref: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> dict[str, OutputDrift]:
    """Drift of every output two runs share with the same shape: the one home of "compare two runs' outputs"
    (the gate's cross-tier matrix and the drift report's both come from here)."""
    return {name: compare_outputs(ref[name], out[name])
            for name in ref if name in out and ref[name].shape == out[name].shape}

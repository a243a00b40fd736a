"""Accuracy against labels, with a Wilson confidence interval (tiergate.stats.wilson_interval)."""

from __future__ import annotations

import numpy as np

from tiergate.figures import Estimate  # noqa: F401 - re-exported (stdlib-only type)


def predictions(output: np.ndarray) -> np.ndarray:
    """Top-1 class per sample: argmax over all non-sample axes (scores flattened)."""
    scores = np.asarray(output).reshape(len(output), -1)
    if scores.shape[1] < 2:
        raise ValueError("top-1 needs at least two scores per sample")
    return scores.argmax(axis=1)


def is_classifier(output: np.ndarray) -> bool:
    """Whether an output has at least two scores per sample, so a top-1 means something."""
    return output.ndim >= 1 and len(output) > 0 and output.size // len(output) >= 2


def correct(output: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-sample correctness (bool) of the top-1 prediction."""
    return predictions(output) == np.asarray(labels)


def proportion(successes: int, n: int, confidence: float = 0.95) -> Estimate:
    """successes / n with a Wilson score interval."""
    if n == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0, confidence)
    from tiergate.stats import wilson_interval

    low, high = wilson_interval(int(successes), int(n), confidence)
    return Estimate(successes / n, float(low), float(high), int(n), confidence)


def accuracy(output: np.ndarray, labels: np.ndarray, confidence: float = 0.95) -> Estimate:
    hits = correct(output, labels)
    return proportion(int(hits.sum()), len(hits), confidence)

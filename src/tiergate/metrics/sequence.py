"""Sequences (text recognition, speech) against their truth: character and word error rates by rapidfuzz's
Levenshtein distance, and exact-match accuracy. Per-sample components, so the paired bootstrap is vectorised:
CER = sum of edits / sum of the truth's lengths (the usual corpus-level rate), likewise WER over words."""

from __future__ import annotations

import numpy as np


def _distance(a, b) -> int:
    from rapidfuzz.distance import Levenshtein

    return int(Levenshtein.distance(a, b))


def _words(text) -> tuple:
    return tuple(text.split()) if isinstance(text, str) else tuple(text)


def error_components(predicted: list, truth: list, words: bool = False) -> np.ndarray:
    """(2, n): each sample's edit distance to its truth and the truth's length (characters, or words)."""
    out = np.zeros((2, len(truth)))
    for i, (p, t) in enumerate(zip(predicted, truth)):
        a, b = (_words(p), _words(t)) if words else (p, t)
        out[0, i], out[1, i] = _distance(a, b), len(b)
    return out


def exact_components(predicted: list, truth: list) -> np.ndarray:
    """(1, n): 1 where the whole sequence equals its truth."""
    return np.array([[float(p == t) for p, t in zip(predicted, truth)]])


def error_rate(c, axis=-1):
    edits, length = np.sum(c[0], axis=axis), np.sum(c[1], axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(length > 0, edits / np.where(length > 0, length, 1), np.where(edits > 0, 1.0, 0.0))

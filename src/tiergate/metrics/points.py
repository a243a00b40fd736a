"""Landmarks and embeddings against their truth, per sample (vectorised paired bootstrap).

Landmarks: the mean distance of each point to its truth, in the output's units (pixels of the model input for
most landmark models), and normalised (NME) by the diagonal of the truth's points' bounding box (`bbox`), by the
input's diagonal (`image`), or not at all (`none`). Embeddings: the cosine of each sample's vector to its truth's
(the FP32 reference's), and how many of each sample's k nearest neighbours (cosine) stay the same."""

from __future__ import annotations

import numpy as np

RETRIEVAL_K = 5


def point_errors(predicted: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """(n,) mean Euclidean distance of each sample's points (N, P, 2) to its truth's."""
    return np.linalg.norm(np.asarray(predicted, np.float64) - np.asarray(truth, np.float64), axis=-1).mean(axis=-1)


def normalisers(truth: np.ndarray, how: str, input_size: tuple[int, ...] = ()) -> np.ndarray:
    t = np.asarray(truth, np.float64)
    if how == "image" and len(input_size) == 2:
        return np.full(len(t), float(np.hypot(*input_size)))
    if how == "bbox":
        extent = t.max(axis=1) - t.min(axis=1)
        return np.maximum(np.hypot(extent[:, 0], extent[:, 1]), 1e-12)
    return np.ones(len(t))


def mean_of_first(c, axis=-1):
    return np.mean(c[0], axis=axis)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float64).reshape(len(a), -1)
    b = np.asarray(b, np.float64).reshape(len(b), -1)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norms > 0, np.einsum("ij,ij->i", a, b) / np.where(norms > 0, norms, 1), 1.0)


def neighbours(vectors: np.ndarray, k: int = RETRIEVAL_K) -> np.ndarray:
    """(n, k) each sample's k nearest other samples by cosine."""
    v = np.asarray(vectors, np.float64).reshape(len(vectors), -1)
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    sim = v @ v.T
    np.fill_diagonal(sim, -np.inf)
    k = max(1, min(k, len(v) - 1))
    return np.argsort(-sim, axis=1, kind="stable")[:, :k]


def retrieval_agreement(vectors: np.ndarray, truth: np.ndarray, k: int = RETRIEVAL_K) -> np.ndarray:
    """(n,) the share of each sample's k nearest neighbours that are also its truth's."""
    mine, theirs = neighbours(vectors, k), neighbours(truth, k)
    return np.array([len(set(a) & set(b)) / len(a) for a, b in zip(mine, theirs)])


def retrieval_precision(vectors: np.ndarray, labels: np.ndarray, k: int = RETRIEVAL_K) -> np.ndarray:
    """(n,) the share of each sample's k nearest neighbours with its own label."""
    near = neighbours(vectors, k)
    labels = np.asarray(labels)
    return (labels[near] == labels[:, None]).mean(axis=1)

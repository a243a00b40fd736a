"""The digits data: one fixed train/test split, pixels scaled to [0, 1], NHWC.

The split does not depend on the model seed, so every demo set (any seed) is
judged on the same held-out images.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from tiergate.errors import InputError

INPUT_NAME = "image"
OUTPUT_NAME = "probs"
LABELS = "labels"
IMAGE_SHAPE = (8, 8, 1)
N_CLASSES = 10
PIXEL_MAX = 16.0        # digits pixels are integers 0..16
TEST_FRACTION = 0.25
SPLIT_SEED = 0
JITTER_SIGMA = 0.05     # Gaussian pixel noise of the extra eval copies (pixels in [0, 1])


@dataclass(frozen=True)
class Split:
    x_train: np.ndarray   # float32 [n, 8, 8, 1] in [0, 1]
    y_train: np.ndarray   # int64 [n]
    x_test: np.ndarray
    y_test: np.ndarray


@lru_cache(maxsize=1)
def digits_split() -> Split:
    """The stratified 75/25 split of scikit-learn's digits, pixels / 16, shape [n, 8, 8, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images.astype(np.float32) / PIXEL_MAX)[..., np.newaxis]
    labels = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        images, labels, test_size=TEST_FRACTION, stratify=labels, random_state=SPLIT_SEED)
    return Split(*(np.ascontiguousarray(a) for a in (x_tr, y_tr, x_te, y_te)))


def calibration_images(n: int, seed: int) -> np.ndarray:
    """`n` training images drawn without replacement: representative calibration data."""
    x_train = digits_split().x_train
    order = np.random.default_rng(seed).permutation(len(x_train))
    return x_train[order[:n]]


def jittered_test_set(n_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n_samples` images and labels: the test split as is, then jittered copies of it.

    The first min(n_samples, len(test)) samples are the untouched test images; every
    further sample repeats a test image with Gaussian pixel noise (clipped to [0, 1]),
    so accuracy on a large set stays close to the test accuracy.
    """
    if n_samples < 1:
        raise InputError(f"eval set size {n_samples}: must be at least 1")
    split = digits_split()
    n_test = len(split.x_test)
    index = np.arange(n_samples) % n_test
    images = split.x_test[index]
    if n_samples > n_test:
        rng = np.random.default_rng(seed)
        extra = images[n_test:]
        extra += rng.normal(0.0, JITTER_SIGMA, size=extra.shape).astype(np.float32)
        np.clip(extra, 0.0, 1.0, out=extra)
    return images, split.y_test[index]


def write_eval_npz(path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    """Write the evaluation archive: the input array named as the model input, plus `labels`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **{INPUT_NAME: images.astype(np.float32, copy=False),
                     LABELS: labels.astype(np.int64, copy=False)})
    tmp.replace(path)
    return path

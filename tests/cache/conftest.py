"""The cache tests' common case: a linear softmax classifier's evaluation set and a writer of its variants."""

from __future__ import annotations

import numpy as np
import pytest

import modelkit


@pytest.fixture
def linear_set(tmp_path):
    """make(seed) -> (rng, w, write): tmp_path/eval.npz holds 400 samples of 8 features labelled by w (8 x 4);
    write(name, weights) saves that classifier with other weights (output "probs") under tmp_path."""
    def make(seed: int):
        rng = np.random.default_rng(seed)
        w = rng.normal(size=(8, 4))
        x = rng.normal(size=(400, 8)).astype(np.float32)
        np.savez(tmp_path / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))

        def write(name, weights):
            return modelkit.write(modelkit.linear(weights, softmax=True, output_name="probs"), tmp_path / name)
        return rng, w, write
    return make

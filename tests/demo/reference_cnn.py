"""An independent numpy implementation of the demo CNN (NHWC, Keras layouts), and tiny random weights."""

from __future__ import annotations

import numpy as np

from tiergate.demo.train import CnnWeights


def tiny_weights(seed: int = 0, filters: int = 4, hidden: int = 8) -> CnnWeights:
    rng = np.random.default_rng(seed)

    def r(*shape, scale=0.5):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return CnnWeights(r(3, 3, 1, filters), r(filters, scale=0.1), r(16 * filters, hidden, scale=0.3),
                      r(hidden, scale=0.1), r(hidden, 10), r(10, scale=0.1))


def random_images(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, (n, 8, 8, 1)).astype(np.float32)


def forward(w: CnnWeights, x: np.ndarray) -> np.ndarray:
    """softmax(fc2(relu(fc1(flatten_hwc(maxpool2(relu(conv3x3_same(x))))))))."""
    x = x.astype(np.float64)
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    conv = sum(np.einsum("nhwc,co->nhwo", padded[:, i:i + 8, j:j + 8, :], w.conv_kernel[i, j])
               for i in range(3) for j in range(3)) + w.conv_bias
    h = np.maximum(conv, 0)
    n, _, _, c = h.shape
    h = h.reshape(n, 4, 2, 4, 2, c).max(axis=(2, 4)).reshape(n, -1)
    h = np.maximum(h @ w.fc1_kernel + w.fc1_bias, 0)
    logits = h @ w.fc2_kernel + w.fc2_bias
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)

"""Training the demo CNN with Keras (TensorFlow imported only inside these functions).

Architecture (NHWC, as Keras and TFLite use it):
    image [b, 8, 8, 1] -> Conv 3x3 x16 (same) + ReLU -> MaxPool 2x2 -> Flatten (h, w, c)
    -> Dense 32 + ReLU -> Dense 10 -> Softmax = probs [b, 10]
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from tiergate.demo.data import IMAGE_SHAPE, INPUT_NAME, N_CLASSES, Split
from tiergate.errors import EnvironmentProblem

CONV_FILTERS = 16
HIDDEN = 32
EPOCHS = 30
BATCH = 32
LEARNING_RATE = 3e-3


@dataclass(frozen=True)
class CnnWeights:
    """The trained weights in Keras layouts: conv HWIO, dense [in, out]; float32."""

    conv_kernel: np.ndarray   # [3, 3, 1, 16]
    conv_bias: np.ndarray     # [16]
    fc1_kernel: np.ndarray    # [4*4*16, 32], rows in (h, w, c) order
    fc1_bias: np.ndarray
    fc2_kernel: np.ndarray    # [32, 10]
    fc2_bias: np.ndarray


def import_tensorflow():
    """TensorFlow, quietly, or one clear error naming the extra to install."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise EnvironmentProblem(
            f"the demo needs TensorFlow to train and convert its models ({exc})",
            hint="pip install 'tiergate[tflite]'") from None
    return tf


def _keras_model(keras):
    inp = keras.Input(IMAGE_SHAPE, name=INPUT_NAME)
    h = keras.layers.Conv2D(CONV_FILTERS, 3, padding="same", activation="relu")(inp)
    h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(HIDDEN, activation="relu")(h)
    out = keras.layers.Dense(N_CLASSES, activation="softmax")(h)
    return keras.Model(inp, out)


def train_cnn(split: Split, seed: int) -> CnnWeights:
    """Train on the training split, deterministically (fixed seed, deterministic ops)."""
    tf = import_tensorflow()
    import keras

    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
    model = _keras_model(keras)
    model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(split.x_train, split.y_train, epochs=EPOCHS, batch_size=BATCH, shuffle=True, verbose=0)
    return CnnWeights(*(np.asarray(w, dtype=np.float32) for w in model.get_weights()))

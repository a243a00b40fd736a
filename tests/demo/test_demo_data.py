import subprocess
import sys

import numpy as np
import pytest

from tiergate.demo import data
from tiergate.demo.models import make_eval_npz
from tiergate.errors import InputError


def test_split_is_the_whole_digits_set_stratified_and_scaled():
    s = data.digits_split()
    assert len(s.x_train) + len(s.x_test) == 1797
    assert s.x_train.shape[1:] == (8, 8, 1) and s.x_train.dtype == np.float32
    assert s.y_test.dtype == np.int64
    assert 0.0 == min(s.x_train.min(), s.x_test.min()) and max(s.x_train.max(), s.x_test.max()) == 1.0
    counts = np.bincount(s.y_test, minlength=10)
    assert counts.min() >= 40 and counts.max() <= 50      # stratified: ~45 of each digit


def test_calibration_images_come_from_training_split_and_depend_on_seed():
    train = data.digits_split().x_train.reshape(len(data.digits_split().x_train), -1)
    a, b = data.calibration_images(16, 0), data.calibration_images(16, 1)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, data.calibration_images(16, 0))
    rows = {r.tobytes() for r in train}
    assert all(img.reshape(-1).tobytes() in rows for img in a)


def test_eval_npz_holds_the_test_split_then_jittered_copies(tmp_path):
    split = data.digits_split()
    n_test = len(split.x_test)
    path = make_eval_npz(tmp_path / "sub" / "eval.npz", n_test * 3 + 5, seed=7)
    with np.load(path) as npz:
        assert sorted(npz.files) == ["image", "labels"]
        images, labels = npz["image"], npz["labels"]
    assert images.shape == (n_test * 3 + 5, 8, 8, 1) and images.dtype == np.float32
    assert labels.dtype == np.int64
    np.testing.assert_array_equal(images[:n_test], split.x_test)
    np.testing.assert_array_equal(labels, np.resize(split.y_test, len(labels)))
    extra = images[n_test:] - np.resize(split.x_test, images[n_test:].shape)
    assert 0.02 < extra.std() < data.JITTER_SIGMA          # noise, shrunk a little by the clipping
    assert images.min() >= 0.0 and images.max() <= 1.0


def test_eval_npz_is_deterministic_per_seed(tmp_path):
    n = len(data.digits_split().x_test) + 50
    a = np.load(make_eval_npz(tmp_path / "a.npz", n, seed=3))["image"]
    b = np.load(make_eval_npz(tmp_path / "b.npz", n, seed=3))["image"]
    c = np.load(make_eval_npz(tmp_path / "c.npz", n, seed=4))["image"]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_small_eval_set_is_a_prefix_of_the_test_split(tmp_path):
    with np.load(make_eval_npz(tmp_path / "e.npz", 10, seed=0)) as npz:
        np.testing.assert_array_equal(npz["image"], data.digits_split().x_test[:10])


@pytest.mark.parametrize("n", [0, -5])
def test_eval_set_size_must_be_positive(tmp_path, n):
    with pytest.raises(InputError, match="at least 1"):
        make_eval_npz(tmp_path / "e.npz", n, seed=0)


def test_importing_the_demo_package_does_not_import_tensorflow():
    code = "import sys, tiergate.demo, tiergate.demo.models; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

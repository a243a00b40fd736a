"""Evaluation data: loading, lazy arrays, validation against a model's inputs."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from tiergate.artifact.model import TensorSpec
from tiergate.errors import InputError
from tiergate.evaldata import ReadAhead, load_eval_data, validate_against

SPECS = [TensorSpec("image", (1, 3, 8, 8), "float32"), TensorSpec("mask", ("batch", 4), "int64")]


@pytest.fixture
def good(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "eval.npz"
    np.savez(path, image=rng.normal(size=(7, 3, 8, 8)).astype(np.float32),
             mask=rng.integers(0, 2, (7, 4)), labels=rng.integers(0, 10, 7))
    return path


def save(tmp_path, **arrays):
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    return path


def test_load_reads_arrays_labels_and_hash(good):
    data = load_eval_data(good)
    with np.load(good) as npz:
        assert np.array_equal(data.arrays["image"], npz["image"])
        assert np.array_equal(data.labels, npz["labels"])
    assert data.n_samples == 7
    assert data.sha256 == hashlib.sha256(good.read_bytes()).hexdigest()
    assert set(data.info) == {"image", "mask"} and data.info["image"].shape == (7, 3, 8, 8)
    validate_against(data, SPECS)


def test_arrays_are_read_once_and_batches_are_views(good):
    data = load_eval_data(good)
    assert data.arrays["image"] is data.arrays["image"]
    batches = list(data.iter_batches(3))
    assert [len(b["image"]) for b in batches] == [3, 3, 1]
    assert np.shares_memory(batches[1]["image"], data.arrays["image"])
    assert np.array_equal(np.concatenate([b["mask"] for b in batches]), data.arrays["mask"])


@pytest.mark.parametrize("arrays, specs, message", [
    (dict(image=np.zeros((2, 3, 8, 8), np.float32)), SPECS, "model input 'mask' is missing"),
    (dict(image=np.zeros((2, 3, 8, 8), np.float32), mask=np.zeros((2, 4), np.int64), extra=np.zeros(2)),
     SPECS, "array 'extra' is not a model input"),
    (dict(image=np.zeros((2, 3, 8, 8), np.float64), mask=np.zeros((2, 4), np.int64)),
     SPECS, "input 'image' has dtype float64, the model wants float32"),
    (dict(image=np.zeros((2, 3, 8, 9), np.float32), mask=np.zeros((2, 4), np.int64)),
     SPECS, "input 'image' has shape (2, 3, 8, 9), the model wants (N, 3, 8, 8) (axis 3 is 9, must be 8)"),
    (dict(image=np.zeros((2, 3, 64), np.float32), mask=np.zeros((2, 4), np.int64)),
     SPECS, "input 'image' has shape (2, 3, 64), the model wants (N, 3, 8, 8)"),
])
def test_validation_names_the_input_and_the_problem(tmp_path, arrays, specs, message):
    data = load_eval_data(save(tmp_path, **arrays))
    with pytest.raises(InputError) as err:
        validate_against(data, specs)
    assert message in err.value.one_line()
    assert str(tmp_path / "data.npz") in err.value.one_line()


def test_sample_axis_and_symbolic_dims_are_free(tmp_path):
    data = load_eval_data(save(tmp_path, image=np.zeros((5, 3, 8, 8), np.float32), mask=np.zeros((5, 9), np.int64)))
    # 5 samples where the model says 1, 9 where it says "width": neither is checked ...
    assert validate_against(data, [SPECS[0], TensorSpec("mask", (None, "width"), "int64")]) is None
    # ... while the same 9 against a fixed size is refused, and so is a fixed non-sample axis of the image
    with pytest.raises(InputError, match=r"input 'mask' has shape \(5, 9\), the model wants \(N, 4\)"):
        validate_against(data, [SPECS[0], TensorSpec("mask", (None, 4), "int64")])
    with pytest.raises(InputError, match="axis 1 is 3, must be 4"):
        validate_against(data, [TensorSpec("image", (1, 4, 8, 8), "float32"), TensorSpec("mask", (None, 9), "int64")])


@pytest.mark.parametrize("labels, message", [
    (np.arange(6), "6 labels but the inputs hold 7 samples"),
    (np.array(3), "got a 0-d array"),
    (np.array([b"a"] * 7), "must be numbers, texts"),
    (np.array([1j] * 7), "must be numbers, texts"),
])
def test_bad_labels_are_refused(tmp_path, labels, message):
    path = save(tmp_path, image=np.zeros((7, 3, 8, 8), np.float32), mask=np.zeros((7, 4), np.int64), labels=labels)
    with pytest.raises(InputError, match="labels") as err:
        load_eval_data(path)
    assert message in str(err.value)


def test_labels_checked_again_by_validate_against(good):
    data = load_eval_data(good)
    data.labels = data.labels[:3]
    with pytest.raises(InputError, match="3 labels but the inputs hold 7 samples"):
        validate_against(data, SPECS)


@pytest.mark.parametrize("make, message", [
    (lambda p: None, "file does not exist"),
    (lambda p: p.write_text("not a zip"), "not an .npz archive"),
    (lambda p: np.savez(p, a=np.zeros((3, 2)), b=np.zeros((4, 2))), "disagree on the number of samples ('a' 3, 'b' 4)"),
    (lambda p: np.savez(p, labels=np.arange(3)), "holds no input arrays"),
    (lambda p: np.savez(p, a=np.float32(1.0)), "holds only constants (0-d arrays)"),
    (lambda p: np.savez(p, a=np.zeros((0, 2))), "holds no samples"),
    (lambda p: np.savez(p, a=np.array([{"x": 1}], dtype=object)), "'a' holds Python objects"),
])
@pytest.mark.parametrize("read_ahead", [False, True])
def test_unusable_files_are_one_clear_error(tmp_path, make, message, read_ahead):
    path = tmp_path / "eval.npz"
    make(path)
    with pytest.raises(InputError) as err:
        load_eval_data(path, ahead=ReadAhead(path) if read_ahead else None)
    assert message in str(err.value) and str(path) in str(err.value)


# --- read ahead (the gate reads the archive while it takes the models in) -----------------------------------------

def test_read_ahead_gives_the_same_data(good):
    ahead = ReadAhead(good)
    data, plain = load_eval_data(good, ahead=ahead), load_eval_data(good)
    assert data.sha256 == plain.sha256 == hashlib.sha256(good.read_bytes()).hexdigest()
    assert data.arrays["image"] is ahead.arrays["image"]           # taken, not read again
    assert set(ahead.arrays) == {"image"}                           # integers stay lazy, as check_finite leaves them
    assert np.array_equal(data.arrays["image"], plain.arrays["image"])
    assert np.array_equal(data.arrays["mask"], plain.arrays["mask"]) and np.array_equal(data.labels, plain.labels)
    validate_against(data, SPECS)


def test_read_ahead_of_non_finite_data_is_refused_as_before(tmp_path):
    image = np.zeros((5, 3, 8, 8), np.float32)
    image[3, 1, 2, 2] = np.inf
    path = save(tmp_path, image=image, mask=np.zeros((5, 4), np.int64))
    ahead = ReadAhead(path)
    data = load_eval_data(path, ahead=ahead)
    assert data.arrays["image"] is ahead.arrays["image"]           # taken, and checked as any other
    with pytest.raises(InputError, match=r"input 'image' holds inf at sample 3 \(and 0 other"):
        validate_against(data, SPECS)


def test_a_file_changed_after_its_read_ahead_is_read_again(tmp_path):
    path = save(tmp_path, image=np.zeros((5, 3, 8, 8), np.float32), mask=np.zeros((5, 4), np.int64))
    ahead = ReadAhead(path)
    ahead.of(path)                                                  # read
    changed = np.ones((6, 3, 8, 8), np.float32)
    changed[4, 0, 0, 0] = np.nan
    np.savez(path, image=changed, mask=np.zeros((6, 4), np.int64))
    data = load_eval_data(path, ahead=ahead)
    assert data.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and data.n_samples == 6
    assert np.array_equal(data.arrays["image"], changed, equal_nan=True)
    assert data.arrays["image"] is not ahead.arrays["image"]       # read again, not taken
    with pytest.raises(InputError, match="holds nan at sample 4"):
        validate_against(data, SPECS)
    (tmp_path / "other").mkdir()
    other = save(tmp_path / "other", image=changed[:2], mask=np.zeros((2, 4), np.int64))
    assert ahead.of(other) is None                                  # another file: never taken


def test_read_ahead_never_opens_a_fifo(tmp_path):
    import os
    import time

    path = tmp_path / "fifo.npz"
    os.mkfifo(path)
    t0 = time.monotonic()
    assert ReadAhead(path).of(path) is None                         # no writer: opening it would block
    assert time.monotonic() - t0 < 5

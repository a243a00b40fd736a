"""The TFLite export through TFLiteConverter, on tiny random weights (needs TensorFlow)."""

import numpy as np
import pytest

from demo.host import run_tflite
from demo.reference_cnn import forward, random_images, tiny_weights
from tiergate.demo import tflite_export

pytestmark = [pytest.mark.slow, pytest.mark.tflite_extra]   # importing TensorFlow alone takes 5-12 s here


def Interpreter(model_path):
    from ai_edge_litert.interpreter import Interpreter as _Interpreter

    return _Interpreter(model_path=model_path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("tflite")
    w, calib = tiny_weights(), random_images(64, seed=2)
    return {p: tflite_export.write_tflite(w, out / f"{p}.tflite", p, calib if p == "int8" else None)
            for p in tflite_export.PRECISIONS}


@pytest.mark.parametrize("precision", tflite_export.PRECISIONS)
def test_interface_is_float_image_in_probs_out_with_dynamic_batch(models, precision):
    interp = Interpreter(model_path=str(models[precision]))
    (inp,), (out,) = interp.get_input_details(), interp.get_output_details()
    assert inp["name"] == "image" and out["name"] == "probs"
    assert list(inp["shape_signature"]) == [-1, 8, 8, 1]
    assert inp["dtype"] == np.float32 and out["dtype"] == np.float32


@pytest.mark.parametrize("precision, atol", [("fp32", 1e-5), ("fp16", 2e-2), ("int8", 0.1)])
def test_outputs_follow_the_numpy_reference(models, precision, atol):
    x = random_images(32)
    out = run_tflite(models[precision], x)
    ref = forward(tiny_weights(), x)
    np.testing.assert_allclose(out, ref, atol=atol)
    if precision == "fp32":
        return
    assert not np.array_equal(out, run_tflite(models["fp32"], x))   # really a different model


def _tensor_dtypes(path):
    interp = Interpreter(model_path=str(path))
    return {np.dtype(t["dtype"]).name for t in interp.get_tensor_details()}


def test_precisions_store_the_weight_types_they_claim(models):
    assert "float16" in _tensor_dtypes(models["fp16"]) and "int8" not in _tensor_dtypes(models["fp16"])
    assert "int8" in _tensor_dtypes(models["int8"]) and "float16" not in _tensor_dtypes(models["int8"])
    assert _tensor_dtypes(models["fp32"]) <= {"float32", "int32"}


def test_unknown_precision_is_refused(tmp_path):
    with pytest.raises(ValueError, match="bf16"):
        tflite_export.write_tflite(tiny_weights(), tmp_path / "x.tflite", "bf16")

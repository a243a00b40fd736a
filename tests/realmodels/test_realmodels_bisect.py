"""tiergate bisect on a real case: PaddleOCR's direction classifier quantized s8s8 (kit.int8_s8s8) loses accuracy
on an AVX2 edge x86 (emulated Haswell, whatever this host has): bisect names the onnxruntime graph transformer
behind it, searching the transformers the tier's own runtime reports changing the candidate's graph.

The check is the output's cosine with the FP32 reference (policy agreement = "gate", min_cosine 0.98): on 20
lines (the fewest a gate takes) it fails beyond doubt with every pass on (0.79) and passes with the culprit off
(0.99: what is left is the quantization's own error), where the accuracy ratio needs 72 lines or more to decide
(see test_realmodels_cpu.py). Each step is a cached gate of the candidate alone: the FP32 reference runs once.
--first: the search from the last pass only, in 4 gates of about 50 s here (every pass on, every pass off, then
the last two passes alone: NhwcTransformer, then QDQSelectorActionTransformer, the fusion that picks the int8
kernels; delta debugging took 7), in one shard (under make test the other core is another worker's, and a second
shard would only repeat the session's start); the search from the first pass, which names ConstantFolding as
another link of the same chain, and a state inconclusive at the reference's value counted as fixed (the accuracy
ratio on 400 lines: 0.918 REJECT with every pass on, 1.000 INCONCLUSIVE with the fusion off), are the fakes' tests
(tests/bisect)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tiergate.cli.main import main

from . import kit

pytestmark = [pytest.mark.realmodels, pytest.mark.docker, pytest.mark.emulated, pytest.mark.slow]
AVX2 = "x86_64-avx2-onnxruntime"
LINES = 20


@pytest.fixture(scope="module")
def case(real_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bisect")
    source = real_model("paddleocr_cls")
    x, y = kit.text_lines(72, seed=0)
    np.savez(folder / "lines.npz", x=x[:LINES], labels=y[:LINES])
    calibration, _ = kit.text_lines(64, seed=1)
    policy = folder / "policy.toml"
    policy.write_text('[defaults]\nagreement = "gate"\nmin_cosine = 0.98\nmin_sqnr_db = false\n')
    return {"candidate": kit.int8_s8s8(source, folder, calibration), "reference": source,
            "data": folder / "lines.npz", "policy": policy}


def test_bisect_names_the_qdq_transformer_on_the_avx2_tier(case, realmodels_home, capsys):
    code = main(["bisect", "-c", str(case["candidate"]), "-r", str(case["reference"]), "-d", str(case["data"]),
                 "--target", AVX2, "--policy", str(case["policy"]), "--first", "--shards", "1", "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "found", (doc, err[-2000:])
    assert doc["culprits"] == ["QDQSelectorActionTransformer"] and doc["alternatives"] == [], doc
    assert doc["check"]["label"].startswith("cosine")
    assert doc["check"]["before"] < 0.95 < 0.98 <= doc["check"]["after"]
    assert "QDQSelectorActionTransformer" in doc["searched"] and len(doc["searched"]) >= 4
    steps = doc["steps"]
    assert steps[0]["applied"] == [] and steps[0]["outcome"] == "fail"
    assert steps[1]["applied"] == doc["searched"] and steps[1]["outcome"] == "pass"
    assert len(steps) <= 4 and steps[-1]["applied"] == ["QDQSelectorActionTransformer"] and steps[-1]["fixed"]
    assert doc["check"]["before"] == steps[0]["value"] and not steps[0]["fixed"]

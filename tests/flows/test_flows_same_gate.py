"""One gate path: the same gate from the CLI and from the Prefect gate flow gives byte-identical decision JSON,
and the second of them is answered from the caches the first left (no container, no new decision)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flows_kit import REPO, TIERGATE

pytestmark = [pytest.mark.docker, pytest.mark.prefect, pytest.mark.slow]

FLOW = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("gate_flow", sys.argv[1])
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
result = module.gate(candidate=sys.argv[2], reference=sys.argv[3], data=sys.argv[4], targets=sys.argv[5],
                     report_dir=sys.argv[6])
print("RESULT " + json.dumps(result))
"""


def test_cli_and_flow_decisions_are_byte_identical_and_the_second_is_a_cache_hit(demo, tmp_path):
    env = {**os.environ, "TIERGATE_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    env.pop("PREFECT_API_URL", None)
    args = [str(demo.candidate("onnx-int8-entropy").path), str(demo.reference_onnx), str(demo.eval_data),
            "x86_64-cpu-onnxruntime"]
    cli = subprocess.run([str(TIERGATE), "gate", "--candidate", args[0], "--reference", args[1], "--data", args[2],
                          "--targets", args[3], "--report-dir", str(tmp_path / "cli"), "--json"],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    by_cli = json.loads(cli.stdout)
    # the demo's good INT8 candidate is honestly INCONCLUSIVE on 450 samples (exit 3); what matters here is sameness
    assert cli.returncode == {"PROMOTE": 0, "INCONCLUSIVE": 3}[by_cli["verdict"]], cli.stderr
    assert by_cli["containers_started"] == 2 and not by_cli["decision_cached"]

    flow = subprocess.run([sys.executable, "-c", FLOW, str(REPO / "flows" / "gate.py"), *args, str(tmp_path / "flow")],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert flow.returncode == 0, flow.stderr[-3000:]
    line = next(ln for ln in flow.stdout.splitlines() if ln.startswith("RESULT "))
    by_flow = json.loads(line.removeprefix("RESULT "))
    assert by_flow["verdict"] == by_cli["verdict"]
    assert by_flow["decision_cached"] is True and by_flow["containers_started"] == 0 and by_flow["cache_hits"] == 2
    cli_json = (tmp_path / "cli" / "gate-decision.json").read_bytes()
    assert cli_json == (tmp_path / "flow" / "gate-decision.json").read_bytes()
    assert len(list((tmp_path / "home" / "decisions").glob("*.json"))) == 1

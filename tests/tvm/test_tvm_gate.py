"""TVM device classes end to end, real containers: the tiny model compiled by TVM in the build step for x86_64
(native) and arm64 (cross-compiled, run under QEMU), gated FP32 against itself through the CLI; inspect's passes and
two configurations that differ in one disabled pass told apart; a model TVM cannot import is that tier's failed
build, never a crash."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tiergate.cli.main import main

TVM_TARGETS = "x86_64-cpu-tvm,arm64-cpu-tvm"
TARGETS = Path(__file__).resolve().parents[2] / "targets"

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _cli(capsys, monkeypatch, home, *args):
    monkeypatch.setenv("TIERGATE_HOME", str(home))
    code = main([*args, "--json"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.emulated
def test_fp32_gated_against_itself_on_both_tvm_tiers(tiny, tvm_home, capsys, monkeypatch):
    code, out, err = _cli(capsys, monkeypatch, tvm_home, "gate", "--candidate", str(tiny["model"]), "--reference",
                          str(tiny["model"]), "--data", str(tiny["data"]), "--targets", TVM_TARGETS)
    assert code == 0, err + out
    decision = json.loads(out)
    assert decision["verdict"] == "PROMOTE"
    assert {c["device_class"] for c in decision["checks"]} == set(TVM_TARGETS.split(","))
    for name, machine in (("x86_64-cpu-tvm", "x86_64"), ("arm64-cpu-tvm", "aarch64")):
        result = json.loads((Path(decision["runs"][f"candidate/{name}"]) / "result.json").read_text())
        assert result["status"] == "ok" and result["machine"] == machine
        assert result["versions"]["tvm"] == "0.27.0.post1" and result["n_samples"] == 24
        assert result["extra"]["evaluation"]["batched"] is False and result["batch_size"] == 1
        graph = decision["runtime"][name]          # the pass list, recorded with the decision
        assert graph["ok"] and graph["runtime"] == "tvm" and graph["machine"] == machine
        assert graph["passes"] and {"name", "fingerprint"} == set(graph["passes"][0])
        assert graph["compile"]["target"] == result["extra"]["tvm"]["target"]
    assert decision["metrics"]["arm64-cpu-tvm"]["emulated"] is True


def test_inspect_lists_passes_and_one_disabled_pass_is_told_apart(tiny, tvm_home, tmp_path, capsys, monkeypatch):
    catalogue = tmp_path / "targets"
    catalogue.mkdir()
    text = (TARGETS / "x86_64-cpu-tvm.toml").read_text()
    (catalogue / "x86_64-cpu-tvm.toml").write_text(text)
    (catalogue / "x86_64-cpu-tvm-nofuse.toml").write_text(text.replace("threads = 1\n",
                                                                       'threads = 1\ndisabled_passes = ["FuseOps"]\n'))
    monkeypatch.setenv("TIERGATE_TARGETS_DIR", str(catalogue))
    code, out, err = _cli(capsys, monkeypatch, tvm_home, "inspect", str(tiny["model"]), "--target",
                          "x86_64-cpu-tvm,x86_64-cpu-tvm-nofuse")
    assert code == 0, err + out
    runtime = json.loads(out)["runtime"]
    full, nofuse = runtime["x86_64-cpu-tvm"]["passes"], runtime["x86_64-cpu-tvm-nofuse"]["passes"]
    names = [p["name"] for p in full]
    assert "FuseOps" in names and "FuseOps" not in [p["name"] for p in nofuse]
    assert all(len(p["fingerprint"]) == 16 for p in full)
    first = next(i for i, (a, b) in enumerate(zip(full, nofuse)) if a != b)
    assert first >= names.index("FuseOps")
    assert full[-1]["fingerprint"] != nofuse[-1]["fingerprint"]
    # the same configuration compiles to the same pass list (from the cache here; fingerprints are deterministic:
    # free variables hashed by position)
    code, out, _ = _cli(capsys, monkeypatch, tvm_home, "inspect", str(tiny["model"]), "--target", "x86_64-cpu-tvm")
    assert json.loads(out)["runtime"]["x86_64-cpu-tvm"]["passes"] == full


def test_a_model_tvm_cannot_import_is_a_failed_tier_not_a_crash(tiny, tvm_home, capsys, monkeypatch):
    code, out, err = _cli(capsys, monkeypatch, tvm_home, "inspect", str(tiny["celu"]), "--target", "x86_64-cpu-tvm")
    assert code == 1, err + out
    report = json.loads(out)
    assert report["runtime"]["x86_64-cpu-tvm"]["ok"] is False
    assert any(f["rule"] == "unsupported-op" and "TVM" in f["message"] and "Celu" in f["message"]
               for f in report["findings"])
    code, out, err = _cli(capsys, monkeypatch, tvm_home, "gate", "--candidate", str(tiny["celu"]), "--reference",
                          str(tiny["model"]), "--data", str(tiny["data"]), "--targets", "x86_64-cpu-tvm")
    assert code == 1 and "Traceback" not in err, err + out
    decision = json.loads(out)
    run = next(c for c in decision["checks"] if c["name"] == "run")
    assert not run["passed"] and "TVM cannot compile" in run["detail"] and "Celu" in run["detail"]
    # TVM's refusal is recorded under the compile's key: the gate (the same model, shapes and toolchain as
    # inspect's compile) says so without compiling again, and tiergate gc removes the record
    assert "recorded when this compile first failed" in run["detail"], run["detail"]
    failed = [p for p in (tvm_home / "compiled").iterdir() if (p / "error.json").is_file()]
    assert len(failed) == 1 and not (failed[0] / "model.so").exists()
    assert json.loads((failed[0] / "source.json").read_text())["artifact_sha256"] == \
        hashlib.sha256(tiny["celu"].read_bytes()).hexdigest()


def test_inspect_without_data_notes_dimensions_only_data_fix(tiny, tvm_home, tmp_path, capsys, monkeypatch):
    import onnx

    model = onnx.load(tiny["model"])
    for dim, name in zip(model.graph.input[0].type.tensor_type.shape.dim[2:], ("H", "W")):
        dim.Clear()
        dim.dim_param = name
    onnx.save(model, tmp_path / "tiny_hw.onnx")
    code, out, err = _cli(capsys, monkeypatch, tvm_home, "inspect", str(tmp_path / "tiny_hw.onnx"), "--target",
                          "x86_64-cpu-tvm")
    assert code == 0, err + out
    report = json.loads(out)
    assert "x86_64-cpu-tvm" not in report["runtime"]
    assert any(f["rule"] == "runtime-graph" and f["severity"] == "warning" and "[N, 3, H, W]" in f["message"]
               for f in report["findings"])


def test_diff_names_the_first_pass_where_two_toolchain_configurations_differ(tiny, tvm_home, capsys, monkeypatch):
    code, out, err = _cli(capsys, monkeypatch, tvm_home, "inspect", str(tiny["model"]), "--target", "arm64-cpu-tvm")
    assert code == 0, err + out
    passes = json.loads(out)["runtime"]["arm64-cpu-tvm"]["passes"]
    assert len(passes) > 100 and all(set(p) == {"name", "fingerprint"} for p in passes)
    code, out, err = _cli(capsys, monkeypatch, tvm_home, "diff", str(tiny["model"]), str(tiny["model"]), "--target",
                          "arm64-cpu-tvm", "--new-disable-pass", "FuseOps")
    assert code == 1, err + out                      # the same file, another toolchain: its IR differs
    doc = json.loads(out)
    assert doc["identical"] and doc["new_disabled_passes"] == ["FuseOps"]
    first = doc["runtime"]["arm64-cpu-tvm"]["first_difference"]
    assert first == f"pass FuseOps (#{[p['name'] for p in passes].index('FuseOps')})", first
    code, out, _ = _cli(capsys, monkeypatch, tvm_home, "diff", str(tiny["model"]), str(tiny["model"]), "--target",
                        "arm64-cpu-tvm")
    assert code == 0 and json.loads(out)["runtime"]["arm64-cpu-tvm"]["first_difference"] is None


def test_a_gate_with_a_tvm_pass_off_compiles_the_candidate_alone_so(tiny, tvm_home, capsys, monkeypatch):
    code, out, err = _cli(capsys, monkeypatch, tvm_home, "gate", "--candidate", str(tiny["model"]), "--reference",
                          str(tiny["model"]), "--data", str(tiny["data"]), "--targets", "x86_64-cpu-tvm",
                          "--disable-pass", "FuseOps")
    assert code == 0, err + out
    decision = json.loads(out)
    assert any("FuseOps" in note for note in decision["notes"])
    graph = decision["runtime"]["x86_64-cpu-tvm"]         # the candidate's compile: FuseOps never ran
    assert graph["disabled"] == ["FuseOps"] and "FuseOps" not in [p["name"] for p in graph["passes"]]
    reference = json.loads((Path(decision["runs"]["reference/x86_64-cpu-tvm"]) / "result.json").read_text())
    assert reference["status"] == "ok" and not reference["extra"].get("disabled_passes")


def test_a_disabled_pass_tvm_never_applies_is_refused_before_any_run(tiny, tvm_home, capsys, monkeypatch):
    """TVM ignores a disabled pass name it does not know: a typo in --disable-pass would switch nothing off. The
    name is checked against the passes the compile applied to the reference on that class (exit 2, one line, the
    closest name offered); a real pass name is gated."""
    def runs():
        return sorted(p.name for p in (tvm_home / "runs").iterdir()) if (tvm_home / "runs").is_dir() else []

    def compiled():
        return sorted(p.name for p in (tvm_home / "compiled").iterdir()) if (tvm_home / "compiled").is_dir() else []

    before, compiles = runs(), compiled()
    code, out, err = _cli(capsys, monkeypatch, tvm_home, "gate", "--candidate", str(tiny["model"]), "--reference",
                          str(tiny["model"]), "--data", str(tiny["data"]), "--targets", "x86_64-cpu-tvm",
                          "--disable-pass", "FuseOpz")
    lines = [line for line in err.splitlines() if line.startswith("tiergate: error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err + out
    assert "--disable-pass FuseOpz" in lines[0] and "did you mean FuseOps?" in lines[0], lines[0]
    assert runs() == before                                   # refused after the build, before any run
    # issue 42: refused before the candidate is compiled (and cached) with the mistyped pass: the reference's compile
    # record is read first (only the reference's own compile may be new here, when this test runs first)
    new = [tvm_home / "compiled" / name for name in set(compiled()) - set(compiles)]
    assert not [f for f in new if "FuseOpz" in (f / "tvm-meta.json").read_text()], new
    code, out, err = _cli(capsys, monkeypatch, tvm_home, "gate", "--candidate", str(tiny["model"]), "--reference",
                          str(tiny["model"]), "--data", str(tiny["data"]), "--targets", "x86_64-cpu-tvm",
                          "--disable-pass", "FuseOps")
    assert code == 0, err + out
    runtime = json.loads(out)["runtime"]["x86_64-cpu-tvm"]
    assert "FuseOps" not in [p["name"] for p in runtime["passes"]]

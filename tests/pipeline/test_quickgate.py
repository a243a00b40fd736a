"""The decision cache's fast path (tiergate.quickgate): an unchanged `tiergate gate` imports nothing heavy and
answers exactly as the normal path's decision-cache hit; anything changed falls back to the normal path.

The request-key tests need no Docker; the gate tests run tiny generated classifiers on x86_64 (real Docker).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer

import modelkit
import tiergate
from tiergate import state
from tiergate import quickgate
from tiergate.cli.main import main
from tiergate.policy import load_policy
from tiergate.request import BuildSettings, GateRequest
from tiergate.targets import resolve

X86, ARM = "x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"
HEAVY = ("numpy", "scipy", "onnx", "onnxruntime", "docker", "prefect", "tensorflow", "sqlalchemy")
SRC = str(Path(tiergate.__file__).resolve().parents[1])


# --- the request key (no Docker) -------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path):
    for name in ("cand.onnx", "ref.onnx", "inc.onnx", "data.npz", "ca.pem", "metric.py"):
        (tmp_path / name).write_bytes(name.encode())
    return tmp_path


def _request(files, **changes) -> GateRequest:
    base = GateRequest(files / "cand.onnx", files / "ref.onnx", str(files / "data.npz"), tuple(resolve(X86)),
                       load_policy(None))
    return dataclasses.replace(base, **changes)


def _key(files, build: BuildSettings = BuildSettings(), **changes) -> str:
    return quickgate.request_key(_request(files, **changes), build)


def test_the_key_names_everything_a_decision_depends_on(files, monkeypatch):
    key = quickgate.request_key(_request(files))
    assert key == quickgate.request_key(_request(files))
    policy = load_policy(None)
    stricter = dataclasses.replace(policy, defaults=dataclasses.replace(policy.defaults, min_cosine=0.999))
    (files / "ca2.pem").write_bytes(b"another CA")
    changed = {
        "policy": dict(policy=stricter),
        "device classes": dict(device_classes=tuple(resolve(f"{X86},arm64-cpu-onnxruntime"))),
        "a device class's content": dict(device_classes=(dataclasses.replace(resolve(X86)[0], cost_per_hour=9.0),)),
        "incumbent": dict(incumbent=files / "inc.onnx"),
        "metric": dict(metrics=("f1",)),
        "custom metric": dict(metrics=(f"{files / 'metric.py'}:score",)),
        "sample axis": dict(sample_axes=("x=1",)),
        "base image": dict(build=BuildSettings(base_image="python:3.11-slim-bookworm")),
        "CA bundle": dict(build=BuildSettings(ca_bundle=files / "ca.pem")),
        "profile": dict(profile=True),
        "a pass switched off": dict(disabled_passes=("ConstantFolding",)),
        "a device class's passes off": dict(device_classes=(dataclasses.replace(resolve(X86)[0],
                                                                               disabled_passes=("NchwcTransformer",)),)),
    }
    keys = {what: _key(files, **change) for what, change in changed.items()}
    assert key not in keys.values() and len(set(keys.values())) == len(keys), keys
    assert _key(files, BuildSettings(ca_bundle=files / "ca2.pem")) != keys["CA bundle"]
    # content, not paths: the same bytes elsewhere are the same request
    (files / "elsewhere").mkdir()
    (files / "elsewhere" / "c.onnx").write_bytes((files / "cand.onnx").read_bytes())
    assert quickgate.request_key(_request(files, candidate=files / "elsewhere" / "c.onnx")) == key
    for name in ("cand.onnx", "ref.onnx", "data.npz"):
        (files / name).write_bytes(b"changed")
        assert quickgate.request_key(_request(files)) != key, name
        (files / name).write_bytes(name.encode())
    (files / "metric.py").write_bytes(b"changed")
    assert quickgate.request_key(_request(files, metrics=(f"{files / 'metric.py'}:score",))) != keys["custom metric"]
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/other.sock")
    assert quickgate.request_key(_request(files)) != key


def test_the_key_follows_the_package_source_and_the_containers_folder(files, monkeypatch, tmp_path):
    key = quickgate.request_key(_request(files))
    code = tmp_path / "code"
    code.mkdir()
    (code / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(quickgate, "PACKAGE", code)
    first = quickgate.request_key(_request(files))
    assert first != key
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"byte code")   # byte code is no source
    assert quickgate.request_key(_request(files)) == first
    (code / "a.py").write_text("x = 2\n")
    assert quickgate.request_key(_request(files)) != first
    containers = tmp_path / "containers"
    containers.mkdir()
    monkeypatch.setattr(quickgate, "containers_dir", lambda: containers)
    before = quickgate.request_key(_request(files))
    (containers / "lock.txt").write_text("onnxruntime==1.0\n")
    assert quickgate.request_key(_request(files)) != before
    pip_conf = tmp_path / "pip.conf"
    monkeypatch.setattr(quickgate, "HOST_PIP_CONF", pip_conf)
    before = quickgate.request_key(_request(files))
    pip_conf.write_text("[global]\nindex-url = https://mirror\n")
    assert quickgate.request_key(_request(files)) != before


def test_every_option_is_defined_once_and_grouped_by_what_it_changes():
    """The request options are GateRequest's fields, the build options BuildSettings', and the rest (run, output)
    never change a decision; `--max-parallel` is spelled in one file of src/."""
    from tiergate import request

    groups = {}
    for o in request.GATE_OPTIONS:
        groups.setdefault(o.group, set()).add(o.param)
    in_request_as = {"targets": "device_classes", "policy": "policy", "metric": "metrics", "sample_axis": "sample_axes",
                     "candidate": "candidate", "reference": "reference", "data": "data", "incumbent": "incumbent",
                     "profile": "profile", "early_stop": "early_stop", "disable_pass": "disabled_passes"}
    assert {in_request_as[p] for p in groups["request"]} == {f.name for f in dataclasses.fields(GateRequest)}
    assert groups["build"] == {f.name for f in dataclasses.fields(BuildSettings)}
    assert groups["run"] == {"registry_url", "max_parallel", "shards"}
    assert groups["output"] == {"as_json", "junit", "report_dir", "explain", "attest", "signing_key",
                                "mlflow_promote"}
    spelled = [p for p in Path(SRC, "tiergate").rglob("*.py") if '"--max-parallel"' in p.read_text()]
    assert [p.name for p in spelled] == ["request.py"]


def _typer_values(args):
    """What the typer command, made from the same table, parses of `args` (None: it refuses them)."""
    from tiergate.cli.options import command
    from tiergate.request import GATE_OPTIONS

    got = {}
    app = typer.Typer()
    app.command("gate")(command(GATE_OPTIONS, got.update, ""))
    app.command("other")(lambda: None)
    try:
        typer.main.get_command(app).main(args=["gate", *args], standalone_mode=False)
    except Exception as exc:  # noqa: BLE001 - click's or typer's own usage errors (typer vendors click)
        if any(k.__name__ == "ClickException" for k in type(exc).__mro__):
            return None
        raise
    return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in got.items()}


def test_the_fast_parser_and_the_typer_command_read_every_option_alike():
    """Both parsers are made from tiergate.request.GATE_OPTIONS: what the fast one accepts, typer reads the same."""
    from tiergate.cli import fastgate
    from tiergate.request import parse

    base = ["-c", "a.onnx", "--reference=b.onnx", "-d", "d.npz", "-t", X86]
    cases = [[], ["--metric", "f1", "--metric", "mae", "--json", "--max-parallel", "3"], ["--no-early-stop"],
             ["--early-stop", "--shards", "3"], ["--sample-axis", "x=1", "--policy", "p.toml", "--incumbent", "i.onnx",
                                                 "--junit", "j.xml", "--report-dir", "r", "--profile", "--explain"],
             ["--base-image", "img:1", "--ca-bundle", "ca.pem", "--registry", "sqlite:///r.db"],
             ["--mlflow-promote", "champion"]]
    for extra in cases:
        assert parse(base + extra) == _typer_values(base + extra), extra
    parsed = parse(base + cases[1])
    assert parsed["candidate"] == Path("a.onnx") and parsed["metric"] == ["f1", "mae"] and parsed["as_json"] is True
    assert parse(base + ["--no-early-stop"])["early_stop"] is False
    for unsure in (["--help"], ["--max-parallel", "0"], ["--max-parallel", "x"], ["--bogus"], ["-c", "again.onnx"],
                   ["--json=1"], ["--policy"], ["extra"]):
        assert parse(base + unsure) is None, unsure
    for refused in (["--max-parallel", "0"], ["--max-parallel", "x"], ["--bogus"], ["--policy"], ["extra"]):
        assert _typer_values(base + refused) is None, refused
    assert parse(base[2:]) is None and _typer_values(base[2:]) is None          # a required option missing
    assert fastgate.answer(base + ["--explain"]) is None and fastgate.answer(base + ["--registry", "x"]) is None
    # MLflow: an alias is resolved every time and the version is tagged: the typer command's path
    assert fastgate.answer(base + ["--mlflow-promote", "champion"]) is None
    assert fastgate.answer(["-c", "models:/digits@challenger", *base[2:]]) is None


def test_no_fast_path_for_a_loader_or_another_engine(files, monkeypatch):
    with pytest.raises(quickgate.NoFastPath):
        quickgate.identity(_request(files, data=f"{files / 'metric.py'}:load"), BuildSettings())
    remote = dataclasses.replace(resolve(X86)[0], docker_host="ssh://edge@10.0.0.7")
    with pytest.raises(quickgate.NoFastPath):
        quickgate.identity(_request(files, device_classes=(remote,)), BuildSettings())
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.7:2375")
    with pytest.raises(quickgate.NoFastPath):
        quickgate.identity(_request(files), BuildSettings())
    assert quickgate.lookup(_request(files)) is None


def test_the_key_names_a_labels_side_file_by_content(files):
    """The archive's `labels` a 0-d string naming a side file (read from the zip without numpy): the file's
    bytes are in the key; numbers or texts in the archive itself are the archive's own bytes."""
    data = files / "with-side.npz"
    np.savez(data, x=np.zeros((4, 2), np.float32), labels=np.array("boxes.json"))
    (files / "boxes.json").write_text('{"images": []}')
    key = _key(files, data=str(data))
    assert quickgate.labels_side_file(data) == files / "boxes.json"
    (files / "boxes.json").write_text('{"images": [] }')
    assert _key(files, data=str(data)) != key
    (files / "boxes.json").unlink()
    with pytest.raises(quickgate.NoFastPath):
        quickgate.identity(_request(files, data=str(data)), BuildSettings())
    np.savez(data, x=np.zeros((4, 2), np.float32), labels=np.array(["a", "b", "c", "d"]))
    assert quickgate.labels_side_file(data) is None
    np.savez(data, x=np.zeros((4, 2), np.float32), labels=np.array(str(files / "abs.txt")))
    assert quickgate.labels_side_file(data) == files / "abs.txt"


def test_artifact_hash_is_intakes_external_data_included(tmp_path):
    from tiergate.artifact import load_artifact

    path = modelkit.write(modelkit.mlp(seed=3), tmp_path / "m.onnx", external="weights/m.bin")
    artifact = load_artifact(path)
    assert artifact.external_data
    doc, hashers = quickgate.identity(_request(tmp_path / "x", candidate=path, reference=path, data=str(path)),
                                      BuildSettings())
    assert quickgate.artifact_sha256(hashers["candidate"], path, list(artifact.external_data)) == artifact.sha256
    assert quickgate.artifact_sha256(hashers["candidate"], path, []) == hashers["candidate"]
    assert doc["artifacts"]["candidate"] != artifact.sha256          # the key's part is the file's bytes alone


# --- real gates -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quickgate")
    rng = np.random.default_rng(1616)         # weights of this file's own: its images are its own
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(400, 8)).astype(np.float32)
    np.savez(folder / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    ref = modelkit.write(modelkit.linear(w, softmax=True), folder / "ref.onnx")
    good = modelkit.write(modelkit.linear(w + rng.normal(0, 1e-4, w.shape), softmax=True), folder / "good.onnx")
    bad = modelkit.write(modelkit.linear(rng.normal(size=w.shape), softmax=True), folder / "bad.onnx")
    return {"ref": ref, "good": good, "bad": bad, "data": folder / "eval.npz", "folder": folder}


def _args(m, *extra, candidate=None, data=None, targets=X86):
    return ["gate", "--candidate", str(candidate or m["good"]), "--reference", str(m["ref"]),
            "--data", str(data or m["data"]), "--targets", targets, *extra]


def _cli(capsys, args):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


WHY: list[str] = []        # why the last _fast was not answered fast, for assertion messages


def _fast(capsys, args) -> tuple[bool, int, str]:
    """(whether the fast path answered this gate, its exit code, its stdout)."""
    answers = []
    lookup = quickgate.lookup

    def spy(*args):
        answers.append(lookup(*args))
        return answers[-1]

    quickgate.lookup = spy
    declined = list(quickgate.DECLINED)       # why the gate before this one saved nothing, if it did not
    try:
        code, out, err = _cli(capsys, args)
    finally:
        quickgate.lookup = lookup
    fast = bool(answers) and answers[-1] is not None
    WHY[:] = [f"missed: {quickgate.MISSED_WHY}; the last gate before it declined to remember: {declined}"]
    assert fast == ("unchanged: the decision from the cache" in err) or "--json" in args
    return fast, code, out


def _sans_provenance(doc: dict) -> dict:
    doc = {k: v for k, v in doc.items() if k not in ("decision_cached", "cache_hits", "containers_started")}
    doc["runtime"] = {dc: {k: v for k, v in graph.items() if k not in ("cached", "seconds")}
                      for dc, graph in doc["runtime"].items()}
    return doc


def _subprocess_gate(home: Path, args: list[str]):
    env = dict(os.environ, TIERGATE_HOME=str(home), PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "tiergate.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=120)
    imported = {line.split("|")[2].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:") and line.count("|") == 2}
    return proc, imported


@pytest.mark.docker
def test_unchanged_rerun_imports_nothing_heavy_and_answers_as_the_cache_hit(models, capsys, tiergate_home, tmp_path):
    args = _args(models, "--json")
    code, out, err = _cli(capsys, args + ["--report-dir", str(tmp_path / "first")])
    assert code == 0, err
    first = json.loads(out)
    assert list((tiergate_home / state.QUICK).glob("*.json")), quickgate.DECLINED          # remembered

    proc, imported = _subprocess_gate(tiergate_home, args + ["--report-dir", str(tmp_path / "fast")])
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "tiergate.quickgate" in imported and "typer" not in imported     # cli/fastgate.py answered
    heavy = sorted(m for m in imported if m.split(".")[0] in HEAVY)
    assert not heavy, heavy
    fast = json.loads(proc.stdout)
    assert fast["decision_cached"] is True and fast["containers_started"] == 0 and fast["cache_hits"] == 2
    # the first run's decision, except what says where it came from (the run and describe caches)
    assert _sans_provenance(fast) == _sans_provenance(first)
    assert all(graph["cached"] for graph in fast["runtime"].values())
    assert (tmp_path / "fast" / "gate-decision.json").read_bytes() == \
        (tmp_path / "first" / "gate-decision.json").read_bytes()

    # exactly what the normal path prints and writes for a decision-cache hit: --json, reports, JUnit, tables
    outputs = _fast_as_normal(capsys, tiergate_home, tmp_path, lambda *extra: _args(models, *extra), code)
    assert "runs: 0 started, 2 reused from cache" in outputs


def _fast_as_normal(capsys, home: Path, tmp_path: Path, args, code: int) -> str:
    """The fast path's answer and the normal path's decision-cache hit print and write the same (--json and the
    tables, --report-dir, --junit); the tables' text."""
    for as_json in (True, False):
        extra = ["--json"] if as_json else []
        outputs = {}
        for way in ("fast", "normal"):
            if way == "normal":
                for entry in (home / state.QUICK).glob("*.json"):
                    entry.unlink()
            folder = tmp_path / f"{way}-{as_json}"
            answered_fast, code_now, out_now = _fast(capsys, args(*extra, "--report-dir", str(folder),
                                                                  "--junit", str(folder / "junit.xml")))
            assert answered_fast == (way == "fast") and code_now == code, (way, as_json, WHY)
            outputs[way] = (out_now.replace(str(folder), "FOLDER"),
                            {p.name: p.read_bytes() for p in sorted(folder.iterdir())})
        assert outputs["fast"][0] == outputs["normal"][0]
        for name, data in outputs["normal"][1].items():
            if data != outputs["fast"][1][name]:
                import difflib
                raise AssertionError(name + "\n" + "\n".join(difflib.unified_diff(
                    data.decode().splitlines(), outputs["fast"][1][name].decode().splitlines(), lineterm="")))
        if as_json:
            assert json.loads(outputs["fast"][0])["decision_cached"] is True
    return outputs["fast"][0]


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.parametrize("candidate", ["good", "bad"])
def test_an_unchanged_gate_with_an_emulated_tier_answers_from_the_cache(models, capsys, tiergate_home, tmp_path,
                                                                        candidate):
    """x86 + emulated arm64, early decision as by default (issue 46): the good candidate is decided on arm64 in
    looks over chunk runs (each chunk, and the prefix a look merged, named by the decision); the bad one is
    REJECTed on x86, which stops arm64. Either way an unchanged re-run answers from the fast path, as the normal
    path's decision-cache hit would, without importing anything heavy."""
    targets = f"{X86},{ARM}"
    args = lambda *extra: _args(models, *extra, candidate=models[candidate], targets=targets)   # noqa: E731
    code, out, err = _cli(capsys, args("--json"))
    first = json.loads(out)
    assert (code, first["verdict"]) == ((0, "PROMOTE") if candidate == "good" else (1, "REJECT")), err
    early = first["early_stop"]
    if candidate == "good":
        assert early[ARM]["looks"] == 2 and early[ARM]["samples_used"] == 400
    else:
        assert early[ARM]["stopped_by"] == X86
    assert list((tiergate_home / state.QUICK).glob("*.json")), quickgate.DECLINED          # remembered

    proc, imported = _subprocess_gate(tiergate_home, args("--json"))
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "typer" not in imported and not [m for m in imported if m.split(".")[0] in HEAVY]
    fast = json.loads(proc.stdout)
    assert fast["decision_cached"] is True and fast["containers_started"] == 0
    assert fast["cache_hits"] == first["cache_hits"] + first["containers_started"]
    assert _sans_provenance(fast) == _sans_provenance(first)
    _fast_as_normal(capsys, tiergate_home, tmp_path, args, code)


@pytest.mark.docker
def test_labels_in_a_side_file_are_answered_from_the_cache_and_their_edits_are_not(capsys, tiergate_home, tmp_path,
                                                                                  monkeypatch):
    """A detector's boxes in a COCO side file (the archive names it: the decision is made on a rewritten archive
    that holds them): an unchanged re-run answers from the fast path, its run folders known by their stamps (not
    hashed again); an edited box file is a new request, decided by the normal path (issue 46)."""
    import onnx

    import taskkit

    fp32 = tmp_path / "yolo.onnx"
    onnx.save(taskkit.yolo_like(), str(fp32))
    copy = taskkit.resaved(fp32, tmp_path / "copy.onnx")
    coco = {"images": [{"id": i} for i in range(40)],
            "annotations": [{"image_id": i, "bbox": [8.0 * (i % 10), 16.0, 96.0, 64.0], "category_id": i % 3}
                            for i in range(40)]}
    (tmp_path / "boxes.json").write_text(json.dumps(coco))
    np.savez(tmp_path / "scenes.npz", images=taskkit.scenes(40, 1), labels=np.array("boxes.json"))
    args = ["gate", "-c", str(copy), "-r", str(fp32), "-d", str(tmp_path / "scenes.npz"), "-t", X86]
    code, out, err = _cli(capsys, args + ["--json"])
    first = json.loads(out)
    assert code == 0 and first["verdict"] == "PROMOTE", err
    assert quickgate.labels_side_file(tmp_path / "scenes.npz") == tmp_path / "boxes.json"

    def never(*_):
        raise AssertionError("a run folder with its stamps unchanged was verified in full again")

    with monkeypatch.context() as patched:
        patched.setattr(state, "run_matches", never)
        fast, code_now, out_now = _fast(capsys, args + ["--json"])
    assert fast and code_now == code, WHY
    assert _sans_provenance(json.loads(out_now)) == _sans_provenance(first)

    coco["annotations"][0]["bbox"] = [0.0, 0.0, 32.0, 32.0]
    (tmp_path / "boxes.json").write_text(json.dumps(coco))
    fast, code_now, out_now = _fast(capsys, args + ["--json"])
    assert not fast and code_now == 0 and json.loads(out_now)["decision_cached"] is False
    assert _fast(capsys, args + ["--json"])[:2] == (True, 0), WHY       # remembered in its turn


@pytest.mark.docker
def test_anything_changed_falls_back_to_the_normal_path(models, capsys, tiergate_home, tmp_path):
    import docker

    args = _args(models)
    code, out, err = _cli(capsys, args)
    assert code == 0, err
    assert _fast(capsys, args)[:2] == (True, 0), WHY

    # a changed policy: the normal path decides (a stricter policy that 400 samples cannot resolve)
    policy = tmp_path / "policy.toml"
    policy.write_text("[defaults]\nmin_accuracy_ratio = 1.0\n")
    fast, code, out = _fast(capsys, args + ["--policy", str(policy)])
    assert not fast and code == 3 and "accuracy_ratio" in out, out
    assert _fast(capsys, args + ["--policy", str(policy)])[:2] == (True, 3), WHY   # then remembered in its turn

    # a changed data file
    data = np.load(models["data"])
    changed = tmp_path / "eval.npz"
    np.savez(changed, x=data["x"][::-1], labels=data["labels"][::-1])
    fast, code, _ = _fast(capsys, _args(models, data=changed))
    assert not fast and code == 0

    # a touched byte of an artifact: the same graph saved with another doc string
    import onnx

    folder = tmp_path / "touched"
    folder.mkdir()
    for name in ("ref.onnx", "good.onnx"):
        (folder / name).write_bytes((models["folder"] / name).read_bytes())
    touched = dict(models, ref=folder / "ref.onnx", good=folder / "good.onnx")
    assert _fast(capsys, _args(touched))[:2] == (True, 0), WHY          # same bytes elsewhere: the same request
    model = onnx.load(str(folder / "good.onnx"))
    model.doc_string = "touched"
    onnx.save(model, str(folder / "good.onnx"))
    fast, code, _ = _fast(capsys, _args(touched))
    assert not fast and code == 0

    # a changed run folder or a removed image: verified before answering
    entry = json.loads(state.quick_entry_path(quickgate.request_key(_request_of(models))).read_text())
    candidate_run = Path(next(folder for role, _, folder in entry["runs"] if role == "candidate"))
    outputs = candidate_run / "outputs.npz"
    saved = outputs.read_bytes()
    outputs.write_bytes(saved + b"\0")
    assert quickgate.lookup(_request_of(models)) is None
    outputs.write_bytes(saved)
    assert quickgate.lookup(_request_of(models)) is not None
    tag = json.loads((candidate_run / "result.json").read_text())["image"]
    _remove_image(docker.from_env(), tag)
    fast, code, _ = _fast(capsys, args)
    assert not fast and code == 0                                   # rebuilt by the normal path
    assert _fast(capsys, args)[:2] == (True, 0), WHY


def _remove_image(client, tag: str) -> None:
    """Remove an image; a container that still holds it is the test's failure, naming it (the gate removes its
    containers before it returns, and no other module runs this module's images: units of work, tests/conftest)."""
    import docker

    try:
        client.images.remove(tag)
    except docker.errors.APIError as exc:
        users = [(c.short_id, c.status, c.labels) for c in client.containers.list(all=True)
                 if c.image.tags and tag in c.image.tags]
        raise AssertionError(f"{tag} is still in use: {users}") from exc


def _request_of(m) -> GateRequest:
    return GateRequest(m["good"], m["ref"], str(m["data"]), tuple(resolve(X86)), load_policy(None))


@pytest.mark.docker
def test_a_registry_takes_the_normal_path(models, capsys, tiergate_home, tmp_path):
    args = _args(models)
    assert _cli(capsys, args)[0] == 0
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    assert main(["register", str(models["good"]), "--model", "clf", "--reference", str(models["ref"]),
                 "--registry", url]) == 0
    fast, code, _ = _fast(capsys, args + ["--registry", url])
    assert not fast and code == 0                   # recorded: the registry holds the decision now
    assert _fast(capsys, args)[:2] == (True, 0), WHY


@pytest.mark.docker
def test_the_normal_path_hashes_the_request_once_and_remembers_only_the_data_it_decided_on(models, capsys,
                                                                                           tiergate_home, tmp_path,
                                                                                           monkeypatch):
    """A gate the fast path cannot answer hashes the files once: the lookup's identity is what `remember` saves
    (no second hashing pass); a data file changed while the gate ran is never remembered under its old hash."""
    calls = []
    identity = quickgate.identity

    def counted(*args):
        calls.append(args[0])
        return identity(*args)

    monkeypatch.setattr(quickgate, "identity", counted)
    data = tmp_path / "eval.npz"
    data.write_bytes(models["data"].read_bytes())
    code, _, err = _cli(capsys, _args(models, "--json", data=data))
    assert code == 0, err
    assert len(calls) == 1                          # the lookup's; remember reused it
    assert len(list((tiergate_home / state.QUICK).glob("*.json"))) == 1, quickgate.DECLINED
    assert _fast(capsys, _args(models, "--json", data=data))[0], WHY

    # the data changes between the lookup and the decision: the entry would name the old bytes
    for entry in (tiergate_home / state.QUICK).glob("*.json"):
        entry.unlink()
    with np.load(models["data"]) as npz:
        x, labels = npz["x"][:300], npz["labels"][:300]
    lookup = quickgate.lookup

    def then_change(*args):
        answer = lookup(*args)
        np.savez(data, x=x, labels=labels)          # after the key was computed, before intake reads it
        return answer

    monkeypatch.setattr(quickgate, "lookup", then_change)
    code, _, err = _cli(capsys, _args(models, "--json", data=data))
    assert code in (0, 3), err                      # decided on the 300 samples intake read
    from tiergate.hashing import file_sha256

    entries = [json.loads(p.read_text()) for p in (tiergate_home / state.QUICK).glob("*.json")]
    assert all(e["request"]["data"] == file_sha256(data) for e in entries)   # never the old bytes' key

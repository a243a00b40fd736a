"""The runtime-graph (describe) cache: a folder is reused only when its sealed manifest verifies; a truncated,
edited or wrong-shape file is discarded and the graph described again, never believed and never a crash."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tiergate import state
from tiergate.execution import describe
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"


class _Client:
    def __init__(self):
        self.images = self

    def get(self, name):
        return SimpleNamespace(id="sha256:" + "1" * 64)


@pytest.fixture
def describing(tmp_path, tiergate_home, monkeypatch):
    monkeypatch.setenv("TIERGATE_CACHE_KEY", str(tmp_path / "cache.key"))
    calls = []

    def attempt(client, dc, image, artifact, work):
        calls.append(image)
        (work / "describe.json").write_text(json.dumps({"ok": False, "error": "refused by the runtime",
                                                        "machine": "x86_64"}))
    monkeypatch.setattr(describe, "_attempt", attempt)
    artifact = SimpleNamespace(sha256="a" * 64, path=tmp_path / "m.onnx", external_data=[])
    dc = resolve(X86)[0]

    def run():
        return describe.describe_runtime(artifact, dc, "tiergate/runtime:x", client=_Client())
    return run, calls


def _folder():
    (folder,) = (state.home() / state.GRAPHS).iterdir()
    return folder


@pytest.mark.parametrize("spoil", ["truncate", "edit", "wrong-shape-resealed", "no-manifest"])
def test_a_spoiled_runtime_graph_is_described_again(describing, spoil, capsys):
    run, calls = describing
    first = run()
    assert not first.cached and first.error == "refused by the runtime" and len(calls) == 1
    assert run().cached and len(calls) == 1                       # intact: from the cache
    describe_json = _folder() / "describe.json"
    if spoil == "truncate":
        describe_json.write_text(describe_json.read_text()[:10])
    elif spoil == "edit":
        describe_json.write_text(json.dumps({"ok": False, "error": "something else", "machine": "x86_64"}))
    elif spoil == "no-manifest":
        (_folder() / state.MANIFEST).unlink()
    else:                                                      # valid seal, a shape this version cannot read
        describe_json.write_text("[1, 2]")
        manifest = {"files": {"describe.json": state.file_sha256(describe_json),
                              "seconds": state.file_sha256(_folder() / "seconds")}}
        state.write_sealed(_folder() / state.MANIFEST, manifest)
    again = run()
    assert not again.cached and again.error == "refused by the runtime" and len(calls) == 2
    assert "discarding the cached runtime graph" in capsys.readouterr().err
    assert run().cached and len(calls) == 2

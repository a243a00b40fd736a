"""Saved decisions and fast-path entries are sealed with an HMAC under a key kept outside the home: an edited
verdict, an entry pointed at another decision, or a home restored from elsewhere (another key) is never believed;
the normal path decides again from the verified runs, the fast path answers nothing. No Docker: fakes, and the
engine's answer about image ids stubbed."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

import gatekit
from fakes import FakeBackend, FakeBuilder
from tiergate import orchestrator, quickgate, state
from tiergate.images import LABEL
from tiergate.policy import load_policy
from tiergate.request import BuildSettings, RunOptions
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"


class Builder(FakeBuilder):
    """FakeBuilder with the labels the fast path reads (runtime and base image names)."""

    def build(self, device_class, intake):
        image = super().build(device_class, intake)
        return dataclasses.replace(image, runtime_tag="fake/runtime:1",
                                   labels={**image.labels, f"{LABEL}.base_image": "fake/base:1"})


@pytest.fixture
def case(tmp_path, linear_set, tiergate_home, monkeypatch):
    monkeypatch.setenv("TIERGATE_CACHE_KEY", str(tmp_path / "keys" / "a.key"))
    rng, w, write = linear_set(7)
    lenient = tmp_path / "lenient.toml"
    lenient.write_text("[defaults]\nmin_accuracy_ratio = 0.0\n")
    # the engine's image ids, as the fast path asks them (over its socket in real life)
    monkeypatch.setattr(quickgate, "image_ids", lambda names, socket, labels=False: {n: _image_id(n) for n in names})
    return {"reference": write("ref.onnx", w), "bad": write("bad.onnx", rng.normal(size=w.shape)),
            "data": tmp_path / "eval.npz", "lenient": lenient, "home": tiergate_home, "tmp": tmp_path}


def _image_id(tag: str) -> str:
    if tag.startswith("fake/x86"):            # FakeBuilder: fake/<class>:<short> is sha256:fake-<class>-<short>
        name, short = tag[len("fake/"):].split(":")
        return f"sha256:fake-{name}-{short}"
    return f"sha256:{tag}"


def _request(case, policy=None):
    return gatekit.request(case["bad"], case["reference"], case["data"], resolve(X86), policy or load_policy(None))


def _gate(case, policy=None, remember=True):
    request = _request(case, policy)
    recorder = quickgate.Recorder(Builder())
    run = orchestrator.gate(request, orchestrator.Seams(builder=recorder, backend_for=FakeBackend()), RunOptions())
    if remember:
        assert quickgate.remember(request, BuildSettings(), run, recorder) is not None
    return run


def _edit(path, change):
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _promote(doc):
    doc["decision"]["verdict"] = "PROMOTE"


def test_an_edited_verdict_is_believed_on_neither_path(case, capsys):
    first = _gate(case)
    assert first.decision.verdict == "REJECT"
    assert quickgate.lookup(_request(case)).decision.verdict == "REJECT"        # the fast path answers it
    _edit(state.decision_path(first.decision_key), _promote)
    assert quickgate.lookup(_request(case)) is None                              # the fast path: not believed
    again = _gate(case, remember=False)                                          # the normal path decides again
    assert again.decision.verdict == "REJECT" and not again.decision_cached
    assert "seal is missing or wrong" in capsys.readouterr().err
    assert _gate(case, remember=False).decision_cached                           # and caches its own, sealed


def test_a_quick_entry_pointed_at_a_more_lenient_decision_is_not_believed(case):
    strict = _gate(case)
    lenient = _gate(case, load_policy(case["lenient"]))
    assert (strict.decision.verdict, lenient.decision.verdict) == ("REJECT", "PROMOTE")
    entry_path = state.quick_entry_path(quickgate.request_key(_request(case)))
    lenient_inputs = json.loads(state.decision_path(lenient.decision_key).read_text())["inputs"]

    def point(doc):
        doc["decision_key"], doc["decision_inputs"] = lenient.decision_key, lenient_inputs
    _edit(entry_path, point)
    assert quickgate.lookup(_request(case)) is None                      # its seal no longer verifies
    # even sealed again (consistent with itself), it names another policy than the request's
    _edit(entry_path, lambda doc: doc.__setitem__("seal", state.seal_of(doc, state.cache_key())))
    assert state.read_quick_entry(quickgate.request_key(_request(case))) is not None
    assert quickgate.lookup(_request(case)) is None


def test_a_home_sealed_under_another_key_is_decided_again(case, monkeypatch, capsys):
    first = _gate(case)
    assert quickgate.lookup(_request(case)) is not None
    monkeypatch.setenv("TIERGATE_CACHE_KEY", str(case["tmp"] / "keys" / "b.key"))      # another machine's key
    assert quickgate.lookup(_request(case)) is None
    again = _gate(case, remember=False)
    assert not again.decision_cached and again.decision.verdict == first.decision.verdict
    # the runs too were sealed under the other key (issue 42): run again, then decided again
    assert "discarding the saved run" in capsys.readouterr().err and again.containers_started >= 1


def test_without_a_usable_key_the_gate_decides_and_caches_nothing(case, monkeypatch, capsys):
    blocker = case["tmp"] / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TIERGATE_CACHE_KEY", str(blocker / "cache.key"))     # its folder cannot be made
    run = _gate(case, remember=False)
    assert run.decision.verdict == "REJECT" and not run.decision_cached
    assert not state.decision_path(run.decision_key).exists()
    assert "decisions are not cached" in capsys.readouterr().err
    assert not _gate(case, remember=False).decision_cached


def test_the_key_is_made_once_0600_and_gates_at_once_agree_on_it(tmp_path, monkeypatch):
    import os

    path = tmp_path / "config" / "tiergate" / "cache.key"
    monkeypatch.delenv("TIERGATE_CACHE_KEY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert state.cache_key_path() == path
    got, start = [], threading.Barrier(8)

    def one():
        start.wait()
        got.append(state.cache_key())
    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1 and len(got[0]) == 32 and path.read_bytes() == got[0]
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["cache.key"]          # no part file left

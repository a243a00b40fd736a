"""A decision names the policy file it was made under, even when another file of the same content was decided
first (the decision cache keys policies by content and by file)."""

from __future__ import annotations

import dataclasses

import numpy as np

import gatekit
import modelkit
from fakes import FakeBackend, FakeBuilder
from tiergate import orchestrator, quickgate
from tiergate.policy import load_policy
from tiergate.request import GateRequest
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"


def test_two_policy_files_of_one_content_each_name_their_own_file(tmp_path, tiergate_home, monkeypatch):
    monkeypatch.setenv("TIERGATE_CACHE_KEY", str(tmp_path / "cache.key"))
    w = np.random.default_rng(5).normal(size=(8, 4))
    x = np.random.default_rng(6).normal(size=(100, 8)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    ref = modelkit.write(modelkit.linear(w, softmax=True), tmp_path / "ref.onnx")
    cand = modelkit.write(modelkit.linear(w + 1e-4, softmax=True), tmp_path / "cand.onnx")
    one, two = tmp_path / "one.toml", tmp_path / "two.toml"
    for path in (one, two):
        path.write_text("[defaults]\nmin_cosine = 0.99\n")
    seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=FakeBackend())
    for path in (one, two, one):
        run = gatekit.gate(cand, ref, tmp_path / "eval.npz", resolve(X86), load_policy(path), seams=seams)
        assert run.decision.policy_sources[-1] == str(path)
    assert run.decision_cached                              # the first file's decision, from the cache

    request = GateRequest(cand, ref, str(tmp_path / "eval.npz"), tuple(resolve(X86)), load_policy(one))
    assert quickgate.request_key(request) != quickgate.request_key(dataclasses.replace(request,
                                                                                       policy=load_policy(two)))

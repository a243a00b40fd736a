"""Registry records on a real SQLite file: artifacts, lineage, runs and the cache, decisions and aliases."""

from __future__ import annotations

import numpy as np
import pytest
from registry_kit import add, at, make_onnx
from sqlalchemy import create_engine, text

from tiergate import results
from tiergate.errors import EnvironmentProblem, InputError
from tiergate.registry import Check, NewRun, Registry, count_rows
from tiergate.registry.store import file_sha256

DATA = "d" * 64


def _run(device_class="x86_64-cpu-onnxruntime", tier="x86-server", status="ok", image="sha256:img1", **kw):
    return NewRun(device_class=device_class, tier=tier, status=status, image_id=image, data_sha256=DATA, **kw)


def test_add_and_find_artifact(registry, tmp_path):
    model = make_onnx(tmp_path / "m.onnx", seed=1)
    record = add(registry, model, tags={"team": "vision"}, config_sha="c" * 64)
    assert record.sha256 == file_sha256(model) and record.tags == {"team": "vision"}
    again = registry.find_artifact(record.sha256)
    assert again == record and again.registered_at == at(0)
    assert registry.artifact(record.sha256[:8]) == record
    assert registry.store.exists(record.store_key)
    assert registry.models() == ["digits"]


def test_same_bytes_under_another_model_is_refused(registry, tmp_path):
    model = make_onnx(tmp_path / "m.onnx", seed=1)
    add(registry, model, model="digits")
    assert add(registry, model, model="digits").model == "digits"  # idempotent
    with pytest.raises(InputError, match="already registered as model 'digits'"):
        add(registry, model, model="faces")
    assert count_rows(registry)["artifacts"] == 1


def test_unknown_parent_stores_nothing(registry, tmp_path):
    model = make_onnx(tmp_path / "m.onnx", seed=1)
    with pytest.raises(InputError, match="parent artifact"):
        add(registry, model, parent_sha="e" * 64)
    assert count_rows(registry)["artifacts"] == 0
    assert not any(registry.store.fs.find(registry.store.root))


def test_unknown_and_ambiguous_prefixes(registry, tmp_path):
    with pytest.raises(InputError, match="no artifact"):
        registry.artifact("abcdef")
    model = make_onnx(tmp_path / "m.onnx", seed=1)
    for i, filler in enumerate("01"):
        registry.add_artifact(model, sha256="abcdef" + filler * 58, model="digits", format="onnx",
                              precision="fp32", fingerprint={}, at=at(i))
    with pytest.raises(InputError, match="ambiguous"):
        registry.artifact("abcdef")
    assert registry.artifact("abcdef1").sha256 == "abcdef" + "1" * 58


def test_lineage_children_and_since(registry, tmp_path):
    fp32 = add(registry, make_onnx(tmp_path / "a.onnx", seed=1), at=at(0))
    int8 = add(registry, make_onnx(tmp_path / "b.onnx", seed=2), at=at(10), parent_sha=fp32.sha256,
               reference_sha=fp32.sha256)
    tuned = add(registry, make_onnx(tmp_path / "c.onnx", seed=3), at=at(20), parent_sha=int8.sha256,
                reference_sha=fp32.sha256)
    assert [a.sha256 for a in registry.lineage(tuned.sha256)] == [tuned.sha256, int8.sha256, fp32.sha256]
    assert [a.sha256 for a in registry.children(fp32.sha256)] == [int8.sha256]
    assert [a.sha256 for a in registry.artifacts("digits")] == [fp32.sha256, int8.sha256, tuned.sha256]
    assert [a.sha256 for a in registry.artifacts("digits", since=at(10))] == [int8.sha256, tuned.sha256]
    assert registry.artifacts("other") == []


def test_cached_run_matches_the_exact_input_only(registry, tmp_path):
    sha = add(registry, make_onnx(tmp_path / "m.onnx", seed=1)).sha256
    assert registry.find_cached_run(sha, "x86_64-cpu-onnxruntime", "sha256:img1", DATA) is None
    registry.record_run(_run(status="failed"), sha)
    assert registry.find_cached_run(sha, "x86_64-cpu-onnxruntime", "sha256:img1", DATA) is None
    first = registry.record_run(_run(metrics={"cosine": 0.99}), sha)
    second = registry.record_run(_run(metrics={"cosine": 0.98}), sha)
    hit = registry.find_cached_run(sha, "x86_64-cpu-onnxruntime", "sha256:img1", DATA)
    assert hit == second and hit.id > first.id and hit.metrics == {"cosine": 0.98}
    for miss in ((sha, "x86_64-cpu-onnxruntime", "sha256:img2", DATA),
                 (sha, "arm64-cpu-onnxruntime", "sha256:img1", DATA),
                 (sha, "x86_64-cpu-onnxruntime", "sha256:img1", "e" * 64),
                 (sha, "x86_64-cpu-onnxruntime", "", DATA)):
        assert registry.find_cached_run(*miss) is None


def test_cached_run_reloads_its_result_folder(registry, tmp_path):
    sha = add(registry, make_onnx(tmp_path / "m.onnx", seed=1)).sha256
    result = results.TargetResult(device_class="x86_64-cpu-onnxruntime", status="ok", artifact_sha256=sha, tier="x86-server",
                                  image_id="sha256:img1", data_sha256=DATA, latencies_ns=[5, 6, 7])
    outputs = {"y": np.eye(3, dtype=np.float32)}
    folder = results.save(result, tmp_path / "result", outputs)
    registry.record_run(NewRun.from_result(result, {"cosine": 1.0}, folder), sha)
    hit = registry.find_cached_run(sha, "x86_64-cpu-onnxruntime", "sha256:img1", DATA)
    back = registry.fetch_result(hit, tmp_path / "reloaded")
    assert results.load(back).latencies_ns == [5, 6, 7]
    np.testing.assert_array_equal(results.load_outputs(back)["y"], outputs["y"])


def test_promotion_moves_alias_per_tier_and_keeps_history(registry, tmp_path):
    a = add(registry, make_onnx(tmp_path / "a.onnx", seed=1), at=at(0)).sha256
    b = add(registry, make_onnx(tmp_path / "b.onnx", seed=2), at=at(1)).sha256
    first = registry.record_decision(a, "PROMOTE", tiers=["x86-server", "cortex-a"], at=at(2),
                                     checks=[Check("x86_64-cpu-onnxruntime", "x86-server", "cosine", 0.999, 0.99, ">=", True)],
                                     runs=[_run(metrics={"cosine": 0.999})], cost_tags={"billing": "edge"})
    assert registry.aliases("digits") == {"cortex-a": a, "x86-server": a}
    rejected = registry.record_decision(b, "reject", tiers=["x86-server"], reasons=["accuracy dropped"], at=at(3))
    assert registry.alias("digits", "x86-server").sha256 == a
    registry.record_decision(b, "promote", tiers=["x86-server"], at=at(4))
    assert registry.aliases("digits") == {"cortex-a": a, "x86-server": b}
    history = [(m.tier, m.artifact_sha, m.previous_sha) for m in registry.alias_history("digits")]
    assert history == [("cortex-a", a, None), ("x86-server", a, None), ("x86-server", b, a)]
    stored = registry.decisions("digits")
    assert [d.verdict for d in stored] == ["promote", "reject", "promote"]
    assert stored[0].checks == (Check("x86_64-cpu-onnxruntime", "x86-server", "cosine", 0.999, 0.99, ">=", True),)
    assert stored[0].run_ids == first.run_ids and len(first.run_ids) == 1
    assert stored[0].cost_tags == {"billing": "edge"} and stored[1].reasons == rejected.reasons


def test_unknown_verdict_and_tierless_runs_are_refused(registry, tmp_path):
    a = add(registry, make_onnx(tmp_path / "a.onnx", seed=1)).sha256
    with pytest.raises(InputError, match="verdict"):
        registry.record_decision(a, "maybe", tiers=["x86-server"])
    with pytest.raises(InputError, match="names no tier"):
        registry.record_decision(a, "promote", tiers=["x86-server"], runs=[_run(tier="")])
    with pytest.raises(InputError, match="names no tier"):
        registry.record_run(_run(tier=""), a)
    assert count_rows(registry)["runs"] == 0
    assert count_rows(registry)["decisions"] == 0


def test_bad_url_and_foreign_schema(tmp_path):
    with pytest.raises(InputError, match="not a SQLAlchemy URL"):
        Registry("not a url", tmp_path / "store")
    with pytest.raises(EnvironmentProblem, match="no driver"):
        Registry("nosuchdb://x/y", tmp_path / "store")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    Registry(url, tmp_path / "store").close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE tiergate_meta SET value='99' WHERE key='schema'"))
    engine.dispose()
    with pytest.raises(EnvironmentProblem, match="schema 99"):
        Registry(url, tmp_path / "store")


def test_default_location_follows_tiergate_home(tiergate_home, tmp_path, monkeypatch):
    monkeypatch.delenv("TIERGATE_REGISTRY_URL", raising=False)
    monkeypatch.delenv("TIERGATE_STORE", raising=False)
    with Registry() as registry:
        add(registry, make_onnx(tmp_path / "m.onnx", seed=1))
    assert (tiergate_home / "registry.db").is_file()
    assert len(list((tiergate_home / "store").rglob("model.onnx"))) == 1


def test_schema_compiles_for_postgresql():
    """A team registry is PostgreSQL: every table's DDL must compile for it (no server here to run it)."""
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateTable

    from tiergate.registry import schema

    ddl = [str(CreateTable(t).compile(dialect=postgresql.dialect())) for t in schema.metadata.sorted_tables]
    assert any("TIMESTAMP WITHOUT TIME ZONE" in d for d in ddl) and any("JSON" in d for d in ddl)
    assert len(ddl) == len(schema.metadata.tables) == 9   # explanations: added without a migration (created on first write)

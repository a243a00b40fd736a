"""Explanations recorded with a decision: a table added without a migration (created where first written,
read as empty where absent), one row per new explanation, plain JSON."""

from __future__ import annotations

import numpy as np
import pytest

from tiergate.errors import InputError
from tiergate.registry import Registry
from tiergate.registry import schema as s
from tiergate.registry.store import file_sha256


def _decided(tmp_path, registry: Registry) -> int:
    import modelkit as mk

    path = mk.write(mk.linear(np.ones((4, 3)), np.zeros(3), name="tiny"), tmp_path / "m.onnx")
    registry.add_artifact(path, sha256=file_sha256(path), model="m", format="onnx", precision="int8", fingerprint={})
    return registry.record_decision(file_sha256(path), "reject", tiers=["x86-server"]).id


def test_an_older_registry_without_the_table_reads_none_and_gets_it_on_the_first_write(registry, tmp_path):
    decision = _decided(tmp_path, registry)
    with registry.engine.begin() as conn:          # a registry made before the table existed
        s.explanations.drop(conn)
    again = Registry(registry.url, registry.store)   # opening it changes nothing (it may be read-only)
    try:
        assert again.explanations() == {}
        with again.engine.connect() as conn:
            assert not again.engine.dialect.has_table(conn, "explanations")
        doc = {"candidate": "m.onnx", "targets": {"x86": {"first_divergent": "y", "layers": [{"sqnr_db": float("inf")}]}}}
        first = again.record_explanation(decision, doc)
        assert again.record_explanation(decision, doc) == first          # the same one: not recorded again
        stored = again.explanations([decision])[decision]
        assert stored["targets"]["x86"]["layers"] == [{"sqnr_db": None}]  # plain JSON (no Infinity)
        later = again.record_explanation(decision, {**doc, "reference": "fp32.onnx"})
        assert later != first and again.explanations()[decision]["reference"] == "fp32.onnx"   # the latest
        assert again.explanations([decision + 1]) == {}
        with pytest.raises(InputError, match="no decision 99"):
            again.record_explanation(99, doc)
        with again.engine.connect() as conn:
            assert conn.execute(s.meta.select()).all() == [("schema", "1")]     # still schema 1: no migration
            assert len(conn.execute(s.explanations.select()).all()) == 2
    finally:
        again.close()

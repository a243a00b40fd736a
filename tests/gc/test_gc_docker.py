"""`tiergate gc` on a real Docker engine, a real SQLite registry and real run folders and decisions.

Two models: A's candidate is promoted, B's only rejected. `gc --dry-run --keep-last 0` lists
B's images, run folders and decision and removes nothing; `gc --keep-last 0` removes them and
leaves A's. The images are real (tiny `FROM tiergate/base` builds with the artifact labels).
The engine is shared with other users of this machine: the test only ever removes its own
images, and job containers and volumes are narrowed to the one it makes itself.
"""

from __future__ import annotations

import io
import json
import uuid
from datetime import timedelta

import docker
import pytest

from tiergate import gc
from tiergate.cli.main import main
from tiergate.registry import Registry

from gc_kit import DC, NOW, Home, sha

pytestmark = pytest.mark.docker
BASE = "tiergate/base:bookworm-amd64"


@pytest.fixture
def client():
    c = docker.from_env()
    try:
        c.images.get(BASE)
    except docker.errors.ImageNotFound:
        from partskit import missing_part

        missing_part("base image", f"{BASE} is not built; run scripts/setup")
    yield c
    c.close()


def _build(client, tag: str, name: str) -> str:
    # the tag (unique per test run) is a label too, so the image is this run's own: an image an interrupted
    # earlier run left behind has another id instead of gaining this run's tag
    labels = {"org.tiergate.artifact.sha256": sha(name), "org.tiergate.device_class": DC,
              "org.tiergate.runtime": "onnxruntime", "org.tiergate.runtime_image": "tiergate/runtime-test:none",
              "org.tiergate.test.tag": tag}
    image, _ = client.images.build(fileobj=io.BytesIO(f"FROM {BASE}\n".encode()), tag=tag, labels=labels,
                                   rm=True, pull=False, network_mode="none")
    return image.id


def test_gc_removes_the_unpromoted_model_only(tmp_path, monkeypatch, client, capsys):
    uid = uuid.uuid4().hex[:10]
    repo = f"tiergate/gc-test-{uid}"
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TIERGATE_REGISTRY_URL", raising=False)
    monkeypatch.delenv("TIERGATE_STORE", raising=False)

    class OnlyOurs(gc.DockerEngine):
        """The real engine; job containers and volumes narrowed to this test's (others may be mid-gate)."""

        def inventory(self):
            inv = super().inventory()
            return gc.Inventory(inv.images, tuple(c for c in inv.containers if c.labels.get(gc.JOB_LABEL) == uid),
                                tuple(v for v in inv.volumes if v.labels.get(gc.JOB_LABEL) == uid))

    monkeypatch.setattr(gc, "DockerEngine", OnlyOurs)
    names = ("a1", "a-ref", "b1", "b-ref")
    leftover = None
    try:
        ids = {n: _build(client, f"{repo}:{n}", n) for n in names}
        leftover = client.containers.create(BASE, command=["true"], labels={gc.JOB_LABEL: uid})
        home = Home(tmp_path / "home")
        old = NOW - timedelta(days=60)
        runs = {n: home.run(n, image=ids[n], when=old) for n in names}
        decisions = {c: home.decision(f"{c}1", f"{c}-ref", {"candidate": runs[f"{c}1"], "reference": runs[f"{c}-ref"]},
                                      when=old) for c in "ab"}
        with Registry() as registry:   # the default one: $TIERGATE_HOME/registry.db
            for model, c in (("A", "a"), ("B", "b")):
                for name, ref in ((f"{c}-ref", None), (f"{c}1", f"{c}-ref")):
                    path = tmp_path / f"{name}.onnx"
                    path.write_bytes(name.encode())
                    registry.add_artifact(path, sha256=sha(name), model=model, format="onnx", precision="int8",
                                          fingerprint={}, reference_sha=sha(ref) if ref else None)
            registry.record_decision(sha("a1"), "promote", tiers=["edge"])
            registry.record_decision(sha("b1"), "reject", tiers=["edge"])

        assert main(["gc", "--dry-run", "--keep-last", "0", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        listed = {(i["kind"], i["name"]) for i in out["items"] if i["action"] == "remove"}
        assert listed == {("image", f"{repo}:b1"), ("image", f"{repo}:b-ref"), ("run", runs["b1"]),
                          ("run", runs["b-ref"]), ("decision", f"{decisions['b']}.json")}
        by_name = {i["name"]: i for i in out["items"]}
        assert by_name[f"{repo}:a1"]["action"] == "keep" and by_name[f"{repo}:a1"]["reason"].endswith("promoted: A/edge")
        assert by_name[f"{repo}:a-ref"]["reason"].endswith("FP32 reference of A/edge")
        fresh = next(i for i in out["items"] if i["kind"] == "container")   # a leftover, but within the hour's grace
        assert (fresh["id"], fresh["action"], fresh["reason"]) == (leftover.id, "keep", "created less than 1h ago")
        assert out["would_remove"]["bytes"] == sum(i["size_bytes"] for i in out["items"] if i["action"] == "remove")
        assert all(i["size_bytes"] > 0 for i in out["items"] if i["kind"] == "run")
        for n in names:                                            # the dry run removed nothing
            client.images.get(ids[n])
            assert (home.root / "runs" / runs[n]).is_dir()

        leftover.remove(force=True)
        leftover = None
        assert main(["gc", "--keep-last", "0"]) == 0
        text = capsys.readouterr().out
        assert "removed 5 item(s)" in text
        for n in ("b1", "b-ref"):
            with pytest.raises(docker.errors.ImageNotFound):
                client.images.get(ids[n])
            assert not (home.root / "runs" / runs[n]).exists()
        for n in ("a1", "a-ref"):
            assert client.images.get(f"{repo}:{n}").id == ids[n]
            assert (home.root / "runs" / runs[n]).is_dir()
        assert not (home.root / "decisions" / f"{decisions['b']}.json").exists()
        assert (home.root / "decisions" / f"{decisions['a']}.json").exists()

        assert main(["gc", "--keep-last", "0"]) == 0              # nothing more to do
        assert "removed 0 item(s)" in capsys.readouterr().out
    finally:
        if leftover is not None:
            leftover.remove(force=True)
        for n in names:
            try:
                client.images.remove(f"{repo}:{n}", force=True)
            except docker.errors.ImageNotFound:
                pass

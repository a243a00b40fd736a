"""The gc planner and apply step, with a fake engine and real files and registry (no Docker)."""

from __future__ import annotations

import fcntl
import json
import os
from datetime import timedelta
from pathlib import Path

import pytest

from tiergate import gc
from tiergate.errors import InputError
from tiergate.gc import ContainerInfo, Needs, VolumeInfo
from tiergate.registry import Registry

from gc_kit import NOW, FakeEngine, Home, artifact_image, image_id, runtime_image, sha

OLD = NOW - timedelta(days=60)


def _plan(home: Home, needs: Needs, engine: FakeEngine | None = None, **kw):
    inventory = engine.inventory() if engine is not None else None
    return gc.plan(home.root, needs, inventory, now=NOW, pid_alive=lambda pid: False, **kw)


def _removed(plan, kind: str) -> set[str]:
    return {Path(i.id).name if kind in ("run", "decision") else i.id for i in plan.items if i.kind == kind and i.remove}


def _kept(plan, kind: str) -> set[str]:
    return {Path(i.id).name if kind in ("run", "decision") else i.id for i in plan.items if i.kind == kind and not i.remove}


def _registry(tmp_path: Path) -> Registry:
    return Registry(f"sqlite:///{tmp_path / 'reg.db'}", tmp_path / "store")


def _register(registry: Registry, tmp_path: Path, name: str, model: str, reference: str | None = None, at=None):
    path = tmp_path / "files" / f"{name}.onnx"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(name.encode())
    return registry.add_artifact(path, sha256=sha(name), model=model, format="onnx", precision="int8",
                                 fingerprint={}, reference_sha=sha(reference) if reference else None, at=at)


@pytest.fixture
def two_models(tmp_path):
    """Model A: candidate a1 promoted on tier 'edge' (reference a-ref); model B: b1 rejected (reference b-ref)."""
    home = Home(tmp_path / "home")
    runs = {n: home.run(n) for n in ("a1", "a-ref", "b1", "b-ref")}
    decisions = {"a": home.decision("a1", "a-ref", {"candidate": runs["a1"], "reference": runs["a-ref"]},
                                    verdict="PROMOTE"),
                 "b": home.decision("b1", "b-ref", {"candidate": runs["b1"], "reference": runs["b-ref"]})}
    with _registry(tmp_path) as registry:
        for model, cand in (("A", "a"), ("B", "b")):
            _register(registry, tmp_path, f"{cand}-ref", model, at=OLD)
            _register(registry, tmp_path, f"{cand}1", model, reference=f"{cand}-ref", at=OLD + timedelta(hours=1))
        registry.record_decision(sha("a1"), "promote", tiers=["edge"])
        registry.record_decision(sha("b1"), "reject", tiers=["edge"])
        needs = gc.registry_needs(registry, keep_last=0)
    engine = FakeEngine(images=[artifact_image(n) for n in ("a1", "a-ref", "b1", "b-ref")] + [runtime_image()])
    return home, runs, decisions, needs, engine


def test_only_the_unpromoted_model_is_removed(two_models):
    home, runs, decisions, needs, engine = two_models
    plan = _plan(home, needs, engine, keep_last=0)
    assert _removed(plan, "run") == {runs["b1"], runs["b-ref"]}
    assert _kept(plan, "run") == {runs["a1"], runs["a-ref"]}
    assert _removed(plan, "decision") == {f"{decisions['b']}.json"}
    assert _removed(plan, "image") == {image_id("b1"), image_id("b-ref")}
    reasons = {i.name: i.reason for i in plan.items}
    assert reasons[runs["a1"]].endswith("promoted: A/edge")
    assert reasons[runs["a-ref"]].endswith("FP32 reference of A/edge")
    assert all(i.size > 0 for i in plan.removals)


def test_alias_needs_survive_every_flag(two_models):
    home, runs, decisions, needs, engine = two_models
    plan = _plan(home, needs, engine, keep_last=0, older_than=timedelta(0), all_images=True, runtime_images=True)
    assert needs.protected == {sha("a1"), sha("a-ref")}
    kept = {i.artifact for i in plan.kept}
    assert {sha("a1"), sha("a-ref")} <= kept
    assert not [i for i in plan.removals if i.artifact in needs.protected]
    assert image_id("tiergate/runtime-onnxruntime-amd64:r1") in _kept(plan, "image")  # A's images are built on it


def test_keep_last_keeps_recent_registered_artifacts(two_models):
    home, runs, decisions, needs, engine = two_models
    with _registry(home.root.parent) as registry:
        needs = gc.registry_needs(registry, keep_last=1)
    plan = _plan(home, needs, engine, keep_last=1)
    assert _kept(plan, "run") == set(runs.values())       # b1 is B's newest; b-ref is its reference
    assert "one of the last 1 artifacts of B" in {i.reason.split(": ", 1)[-1] for i in plan.items}
    assert not plan.removals


def test_dry_run_plan_removes_nothing_and_apply_does(two_models):
    home, runs, decisions, needs, engine = two_models
    plan = _plan(home, needs, engine, keep_last=0)
    assert (home.root / "runs" / runs["b1"]).is_dir()       # planning touched nothing
    assert len(engine.images) == 5
    gc.apply(plan, home.root, engine)
    assert not (home.root / "runs" / runs["b1"]).exists()
    assert not (home.root / "decisions" / f"{decisions['b']}.json").exists()
    assert (home.root / "runs" / runs["a1"]).is_dir() and (home.root / "decisions" / f"{decisions['a']}.json").exists()
    assert {i.id for i in engine.images} == {image_id("a1"), image_id("a-ref"), image_id("tiergate/runtime-onnxruntime-amd64:r1")}
    assert all(i.removed and i.error is None for i in plan.removals)


def test_older_than_keeps_recent_things(tmp_path):
    home = Home(tmp_path)
    old, new = home.run("old", when=NOW - timedelta(days=40)), home.run("new", when=NOW - timedelta(days=2))
    plan = _plan(home, Needs(), keep_last=0, older_than=gc.parse_duration("30d"))
    assert _removed(plan, "run") == {old}
    assert _kept(plan, "run") == {new}
    assert [i.reason for i in plan.kept] == ["newer than 30d (--older-than)"]


def test_unregistered_candidates_keep_their_last_n_decisions_and_what_they_name(tmp_path):
    home = Home(tmp_path)
    runs = {n: home.run(n) for n in ("c", "ref")}
    other_ref = home.run("ref2")
    older = home.decision("c", "ref2", {"candidate": runs["c"], "reference": other_ref}, when=NOW - timedelta(days=9))
    newer = home.decision("c", "ref", {"candidate": runs["c"], "reference": runs["ref"]}, when=NOW - timedelta(days=3))
    orphan = home.run("never-decided")
    engine = FakeEngine(images=[artifact_image(n) for n in ("c", "ref", "ref2", "never-decided")])
    plan = _plan(home, Needs(), engine, keep_last=1)
    assert _kept(plan, "decision") == {f"{newer}.json"}
    assert _removed(plan, "decision") == {f"{older}.json"}
    assert _kept(plan, "run") == {runs["c"], runs["ref"]}
    assert _removed(plan, "run") == {other_ref, orphan}
    assert _removed(plan, "image") == {image_id("ref2"), image_id("never-decided")}
    plan0 = _plan(home, Needs(), engine, keep_last=0)
    assert not plan0.kept and len(plan0.removals) == 2 + 4 + 4


def test_pending_runs_and_live_parts_are_kept(tmp_path):
    home = Home(tmp_path)
    pending = home.run("p", when=NOW - timedelta(days=50))
    recent = home.run("r", when=NOW - timedelta(minutes=10))
    for part in ("deadbeef.part-999999-1", "cafe.part-4242-1"):
        (home.root / "runs" / part).mkdir()
        os.utime(home.root / "runs" / part, (OLD.timestamp(), OLD.timestamp()))
    (home.root / "locks").mkdir()
    (home.root / "locks" / f"{pending}.lock").write_text("")
    (home.root / "locks" / "stale.lock").write_text("")
    with open(home.root / "locks" / f"{pending}.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        plan = gc.plan(home.root, Needs(), None, keep_last=0, now=NOW, pid_alive=lambda pid: pid == 4242)
    reasons = {i.name: i.reason for i in plan.items}
    assert reasons[pending] == "pending: a gate holds its lock"
    assert reasons["cafe.part-4242-1"] == "being written by a gate in progress"
    assert reasons[recent] == "a gate is in progress and this is from the last hour"
    assert _removed(plan, "run") == {"deadbeef.part-999999-1"}
    plan = gc.plan(home.root, Needs(), None, keep_last=0, now=NOW, pid_alive=lambda pid: False)
    assert _removed(plan, "run") == {pending, recent, "deadbeef.part-999999-1", "cafe.part-4242-1"}


def test_compiled_libraries_stay_while_a_kept_image_was_built_from_them(tmp_path):
    """The compile cache (compiled/<key>/): a compile stays while an artifact image that stays was built from it
    (its compile-key label) or its artifact is kept; one whose image goes, one no image was built from and a dead
    compile's part folder go; without the engine's inventory every compile stays; apply removes the folders."""
    home = Home(tmp_path)
    home.run("gone")                                     # this home used the image of "gone": it is removed
    kept = home.compiled("fresh", "k-fresh")             # its image is a day old: kept under --older-than 7d
    with_gone = home.compiled("gone", "k-gone")
    orphan = home.compiled("orphan", "k-orphan")
    promoted = home.compiled("promoted", "k-promoted")
    unknown = home.compiled(None, "k-unknown")
    dead = home.compiled("x", "k-dead.part-999999-1")
    engine = FakeEngine(images=[artifact_image("fresh", when=NOW - timedelta(days=1), compile_key=kept),
                                artifact_image("gone", compile_key=with_gone)])
    needs = Needs(keep={sha("promoted"): "promoted on edge"})
    plan = _plan(home, needs, engine, keep_last=0, older_than=timedelta(days=7))
    compiled = {i.name: i for i in plan.items if i.kind == "compiled"}
    assert {name for name, i in compiled.items() if i.remove} == {with_gone, orphan, unknown, dead}
    assert compiled[kept].reason.startswith("kept image tiergate/") and compiled[kept].reason.endswith("was built from it")
    assert compiled[promoted].reason == f"artifact {sha('promoted')[:12]}: promoted on edge"
    assert compiled[with_gone].artifact == sha("gone") and compiled[with_gone].size >= 2000
    assert image_id("gone") in _removed(plan, "image")
    blind = _plan(home, needs, None, keep_last=0, older_than=timedelta(days=7))
    assert {i.name for i in blind.items if i.kind == "compiled" and i.remove} == {dead}
    gc.apply(plan, home.root, engine)
    assert sorted(p.name for p in (home.root / "compiled").iterdir()) == [kept, promoted]


def test_apply_skips_a_run_a_gate_started_after_planning(tmp_path):
    home = Home(tmp_path)
    key = home.run("x")
    plan = _plan(home, Needs(), keep_last=0)
    (home.root / "locks").mkdir()
    with open(home.root / "locks" / f"{key}.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        gc.apply(plan, home.root, None)
    assert (home.root / "runs" / key).is_dir()
    assert plan.errors and "started this run" in plan.errors[0].error


def test_garbage_decision_files(tmp_path):
    home = Home(tmp_path)
    folder = home.root / "decisions"
    folder.mkdir(parents=True)
    (folder / "0123.pickle").write_bytes(b"\x80\x04old")
    (folder / "bad.json").write_text("{not json")
    (folder / "k.json.part-999999-7").write_text("{}")
    plan = _plan(home, Needs(), keep_last=3)
    assert _removed(plan, "decision") == {"0123.pickle", "bad.json", "k.json.part-999999-7"}


def test_images_this_home_never_used_are_left_alone(tmp_path):
    home = Home(tmp_path)
    foreign = artifact_image("someone-else")
    retagged = artifact_image("mine", tags=("tiergate/x:1", "registry.example/team/model:v1"))
    home.run("mine")
    engine = FakeEngine(images=[foreign, retagged, runtime_image()])
    plan = _plan(home, Needs(), engine, keep_last=0)
    reasons = {i.id: i.reason for i in plan.items if i.kind == "image"}
    assert reasons[foreign.id].startswith("no run of this TIERGATE_HOME used it")
    assert reasons[retagged.id] == "also tagged registry.example/team/model:v1 (not a tiergate tag)"
    assert reasons[runtime_image().id] == "runtime image (--runtime-images to include)"
    assert _removed(_plan(home, Needs(), engine, keep_last=0, all_images=True), "image") == {foreign.id}


def test_runtime_images_only_when_asked_unused_and_old(tmp_path):
    home = Home(tmp_path)
    home.run("gone")
    used, unused = runtime_image("tiergate/runtime-a:1"), runtime_image("tiergate/runtime-b:1")
    young = runtime_image("tiergate/runtime-c:1", when=NOW - timedelta(minutes=5))
    engine = FakeEngine(images=[artifact_image("kept-by-age", runtime_tag="tiergate/runtime-a:1", when=NOW),
                                artifact_image("gone", runtime_tag="tiergate/runtime-b:1"), used, unused, young])
    plan = _plan(home, Needs(), engine, keep_last=0, runtime_images=True, all_images=True,
                 older_than=timedelta(days=1))
    assert _removed(plan, "image") == {image_id("gone"), unused.id}
    reasons = {i.id: i.reason for i in plan.items}
    assert reasons[used.id] == "base of a kept artifact image"
    assert reasons[young.id] == "created less than 1d ago"


def test_leftover_containers_and_volumes(tmp_path):
    def container(name, state, when, volumes=()):
        return ContainerInfo(f"id-{name}", name, {"org.tiergate.device_class": "x"}, state, when, image_id("i"),
                             volumes, 10)

    def volume(name, when):
        return VolumeInfo(name, {"org.tiergate.job": name[:4]}, when, 100)

    engine = FakeEngine(
        containers=[container("run", "running", OLD, ("v-run",)), container("dead", "exited", OLD, ("v-dead",)),
                    container("new", "created", NOW - timedelta(minutes=3))],
        volumes=[volume("v-run", OLD), volume("v-dead", OLD), volume("v-new", NOW - timedelta(minutes=3)),
                 volume("v-orphan", OLD), VolumeInfo("not-ours", {}, OLD)])
    plan = _plan(Home(tmp_path), Needs(), engine)
    assert _removed(plan, "container") == {"id-dead"}
    assert _removed(plan, "volume") == {"v-dead", "v-orphan"}
    reasons = {i.name: i.reason for i in plan.items}
    assert reasons["v-run"] == "used by container run" and reasons["run"] == "running"
    assert reasons["new"] == "created less than 1h ago"
    gc.apply(plan, tmp_path, engine)
    assert [k for k, _ in engine.calls] == ["container", "volume", "volume"]   # containers before their volumes


def test_engine_down_then_up_images_stay_known(tmp_path):
    home = Home(tmp_path)
    home.run("b")
    plan = _plan(home, Needs(), None, keep_last=0)
    gc.apply(plan, home.root, None)                # engine down: the run folder goes, its image is remembered
    assert not (home.root / "runs").exists() or not any((home.root / "runs").iterdir())
    engine = FakeEngine(images=[artifact_image("b")])
    plan = _plan(home, Needs(), engine, keep_last=0)
    assert _removed(plan, "image") == {image_id("b")}
    gc.apply(plan, home.root, engine)
    assert not engine.images and not (home.root / gc.LEDGER).exists()


def test_a_failed_removal_is_recorded_and_the_rest_goes_on(tmp_path):
    home = Home(tmp_path)
    home.run("b"), home.run("c")
    engine = FakeEngine(images=[artifact_image("b"), artifact_image("c")])
    engine.refuse = set(artifact_image("b").tags)
    plan = gc.apply(_plan(home, Needs(), engine, keep_last=0), home.root, engine)
    assert [i.id for i in plan.errors] == [image_id("b")] and "409" in plan.errors[0].error
    assert [i.id for i in engine.images] == [image_id("b")]
    assert json.loads((home.root / gc.LEDGER).read_text())["images"] == [image_id("b").split(":")[1][:12]]


def test_durations_and_sizes():
    assert gc.parse_duration("30d") == timedelta(days=30)
    assert gc.parse_duration("12h") == timedelta(hours=12)
    assert gc.parse_duration("0") == timedelta(0)
    for bad in ("30", "3x", "", "d"):
        with pytest.raises(InputError):
            gc.parse_duration(bad)
    assert gc.human_size(512) == "512 B" and gc.human_size(3 * 1024 ** 2) == "3.0 MiB"

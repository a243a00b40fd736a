"""Images are not removed under a running gate: a gate leases the images it uses (tiergate.leases, one folder for
the whole machine), and `tiergate gc` in any home keeps every image a held lease names (issue 25, item 4)."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest

from tiergate import gc, leases
from tiergate.cli.main import main
from tiergate.gc import Needs

from gc_kit import NOW, FakeEngine, Home, artifact_image

OLD = NOW - timedelta(days=60)


@pytest.fixture
def lease_dir(tmp_path, monkeypatch):
    folder = tmp_path / "leases"
    monkeypatch.setenv(leases.ENV, str(folder))
    return folder


def _removed_images(plan) -> set[str]:
    return {i.id for i in plan.items if i.kind == "image" and i.remove}


def test_a_held_lease_keeps_its_image_and_a_released_one_does_not(tmp_path, lease_dir):
    home = Home(tmp_path / "home-a")          # this home used the image once: gc here would remove it
    home.run("shared")
    image = artifact_image("shared")
    engine = FakeEngine(images=[image])

    def plan():
        return gc.plan(home.root, Needs(), engine.inventory(), keep_last=0, now=NOW, pid_alive=lambda pid: False,
                       leased=leases.leased())

    with leases.holding():                    # a gate (of another home) uses the same image, by tag
        leases.add(image.tags[0])
        kept = [i for i in plan().items if i.kind == "image"]
        assert not _removed_images(plan())
        assert kept[0].reason.startswith("in use by a running gate (lease ")
    with leases.holding():                    # or by id
        leases.add(image.id)
        assert not _removed_images(plan())
    assert not list(lease_dir.glob("*.json"))          # released: nothing left
    assert _removed_images(plan()) == {image.id}


def test_a_killed_gates_lease_is_stale_and_removed(lease_dir):
    code = ("import sys, time; from tiergate import leases\n"
            "with leases.holding():\n"
            "    leases.add('sha256:' + 'ab' * 32); print('held', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert "ab" * 6 in gc.image_key(next(iter(leases.leased())))   # another process's held lease is seen
    finally:
        proc.kill()
        proc.wait()
    assert leases.leased() == {}                       # its lock died with it
    assert not [p for p in lease_dir.iterdir() if p.name != leases.GC_LOCK]   # and the stale files are gone


def test_the_gate_leases_its_images_for_its_life(tmp_path, tiergate_home, lease_dir):
    """Through the orchestrator: while the runs go on, the lease names every image the gate built (or found)."""
    import gatekit
    from fakes import FakeBackend, FakeBuilder
    from tiergate import orchestrator
    from tiergate.policy import load_policy
    from tiergate.targets import resolve

    cand, ref, data = gatekit.tiny_pair(tmp_path)
    seen: list[dict] = []

    class Watching(FakeBackend):
        def run(self, job):
            seen.append(leases.leased(prune=False))
            return super().run(job)

    backend = Watching()
    seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=backend)
    gatekit.gate(cand, ref, data, resolve(["x86_64-cpu-onnxruntime"]), load_policy(None), seams=seams)
    images = {job.image.image_id for job in backend.jobs} | {job.image.tag for job in backend.jobs}
    assert seen and all(images <= set(during) for during in seen)
    assert leases.leased() == {}                       # the gate ended: its lease is gone


def test_gc_in_another_home_keeps_a_running_gates_image(tmp_path, lease_dir, monkeypatch, capsys):
    """The CLI: `tiergate gc` reads the machine's leases (under the gc lock) and keeps what they name."""
    home = Home(tmp_path / "home-b")
    home.run("shared", when=OLD)
    image = artifact_image("shared")
    engine = FakeEngine(images=[image])
    monkeypatch.setenv("TIERGATE_HOME", str(home.root))
    monkeypatch.delenv("TIERGATE_REGISTRY_URL", raising=False)
    monkeypatch.setattr(gc, "DockerEngine", lambda: engine)
    with leases.holding():
        leases.add(image.id)
        assert main(["gc", "--keep-last", "0"]) == 0
    assert [i.id for i in engine.images] == [image.id] and ("image", image.tags[0]) not in engine.calls
    assert main(["gc", "--keep-last", "0"]) == 0          # the gate is over: now it goes
    assert engine.images == []


def test_older_than_beyond_the_calendar_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TIERGATE_REGISTRY_URL", raising=False)
    for age in ("99999999999d", "800000d", "9" * 400 + "w"):
        assert main(["gc", "--dry-run", "--older-than", age]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tiergate: error: --older-than") and "too long" in err and "Traceback" not in err

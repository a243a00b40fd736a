"""Several artifacts in one harness start, ranges of the samples, batched evaluation (local process backend:
the same harness as in the containers, no Docker)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import execution_kit as kit
from tiergate import results
from tiergate.execution import Job, LocalProcessBackend
from tiergate.execution.base import harness_command, run_group
from tiergate.execution.run import execute_group

ONNX_CLASS = "x86_64-cpu-onnxruntime"
TFLITE_CLASS = "x86_64-cpu-tflite"


def _job(model, data, out, **fields):
    return Job(kit.device_class(ONNX_CLASS), data, out, artifact_path=model, **fields)


def _batch_coupled(path):
    """y = x - mean(x over the batch): each sample's output depends on the others in its call."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1), helper.make_node("Sub", ["x", "m"], ["y"])],
        "coupled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", kit.N_FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", kit.N_FEATURES])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_batched_outputs_equal_single_calls_with_fewer_calls(models, tmp_path):
    data = kit.eval_data(tmp_path / "eval.npz", n=100)
    single = LocalProcessBackend().run(_job(models["mlp"], data, tmp_path / "single"))
    batched = LocalProcessBackend().run(_job(models["mlp"], data, tmp_path / "batched", eval_batch=16,
                                             latency_calls=5))
    assert single.ok and batched.ok, (single.reason, batched.reason)
    assert len(single.latencies_ns) == 100 and len(batched.latencies_ns) == 5
    assert batched.batch_size == 1                       # latency is per call at the class's batch size
    ev = batched.extra["evaluation"]
    assert ev["batched"] and ev["eval_batch"] == 16 and ev["eval_calls"] == 7 and ev["checked_samples"] == 5
    assert ev["max_abs_diff"] <= 1e-5
    a, b = results.load_outputs(tmp_path / "single")["y"], results.load_outputs(tmp_path / "batched")["y"]
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert single.extra["evaluation"] == {"batched": False, "latency_batch": 1, "latency_calls": 100}


def test_batch_dependent_outputs_fall_back_to_single_calls(tmp_path):
    model = _batch_coupled(tmp_path / "coupled.onnx")
    data = kit.eval_data(tmp_path / "eval.npz", n=40)
    single = LocalProcessBackend().run(_job(model, data, tmp_path / "single"))
    batched = LocalProcessBackend().run(_job(model, data, tmp_path / "batched", eval_batch=8, latency_calls=4))
    assert single.ok and batched.ok
    ev = batched.extra["evaluation"]
    assert ev["batched"] is False and "every sample evaluated at batch 1" in ev["reason"] and ev["max_abs_diff"] > 0.1
    np.testing.assert_array_equal(results.load_outputs(tmp_path / "batched")["y"],
                                  results.load_outputs(tmp_path / "single")["y"])


def test_a_fixed_batch_dimension_is_never_batched(models, tmp_path):
    data = kit.eval_data(tmp_path / "eval.npz", n=20)
    result = LocalProcessBackend().run(_job(models["mlp_b1"], data, tmp_path / "out", eval_batch=16, latency_calls=4))
    assert result.ok and result.extra["evaluation"]["batched"] is False and len(result.latencies_ns) == 20


def test_a_range_of_the_samples(models, tmp_path):
    data = kit.eval_data(tmp_path / "eval.npz", n=30)
    result = LocalProcessBackend().run(_job(models["mlp"], data, tmp_path / "out", samples=(7, 19)))
    assert result.ok and result.n_samples == 12 and len(result.latencies_ns) == 12
    np.testing.assert_allclose(results.load_outputs(tmp_path / "out")["y"], kit.host_onnx(models["mlp"], data)["y"][7:19],
                               rtol=1e-6)


def test_several_artifacts_in_one_process_keep_their_own_results(models, tmp_path):
    """One harness start: each artifact in its own child; one that fails does not lose the others."""
    data = kit.eval_data(tmp_path / "eval.npz", n=12)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(models["mlp"].read_bytes()[:200])          # truncated: the runtime refuses it
    jobs = [_job(models["mlp"], data, tmp_path / "a", role="candidate"),
            _job(broken, data, tmp_path / "b", role="reference"),
            _job(models["mlp_v2"], data, tmp_path / "c", role="incumbent")]
    backend = LocalProcessBackend()
    calls = []
    backend_many = backend.run_many
    backend.run_many = lambda js: calls.append(len(js)) or backend_many(js)
    ran = execute_group(jobs, backend)
    assert calls == [3]                                  # one harness start for all three
    assert [r.ok for r in ran] == [True, False, True]
    assert ran[1].reason.startswith("the harness exited with code 1") and "broken.onnx" in ran[1].reason
    for name, result in (("mlp", ran[0]), ("mlp_v2", ran[2])):
        assert result.n_samples == 12 and result.device.load_ms > 0 and result.device.peak_memory_bytes > 0
        np.testing.assert_allclose(results.load_outputs(jobs[[0, 2][name == "mlp_v2"]].out_dir)["y"],
                                   kit.host_onnx(models[name], data)["y"], rtol=1e-6)
    assert results.load(tmp_path / "b").status == "failed"


def test_run_group_runs_apart_what_cannot_share_a_start(models, tmp_path):
    data = kit.eval_data(tmp_path / "eval.npz", n=6)
    jobs = [_job(models["mlp"], data, tmp_path / "a"), _job(models["mlp_v2"], data, tmp_path / "b", samples=(0, 3))]
    seen = []

    class Recording(LocalProcessBackend):
        def run_many(self, js):
            seen.append(len(js))
            return super().run_many(js)

    ran = run_group(Recording(), jobs)
    assert all(r.ok for r in ran) and [r.n_samples for r in ran] == [6, 3]
    assert seen == [1, 1]                                # different ranges: one start each


def test_harness_command_pairs_models_and_outputs():
    dc = kit.device_class(ONNX_CLASS)
    jobs = [Job(dc, "d.npz", "o1", samples=(2, 9), eval_batch=64, latency_calls=8), Job(dc, "d.npz", "o2")]
    args = harness_command(jobs, ["m1", "m2"], "/data/d.npz", ["/out/0", "/out/1"])
    assert args[:10] == ["--runtime", "onnxruntime", "--model", "m1", "--out", "/out/0", "--model", "m2", "--out",
                         "/out/1"]
    assert "--samples" in args and args[args.index("--samples") + 1] == "2:9"
    assert args[args.index("--eval-batch") + 1] == "64" and args[args.index("--latency-calls") + 1] == "8"
    assert "--eval-batch" not in harness_command([jobs[1]], ["m2"], "d", ["o"])


def test_a_hung_artifact_times_out_alone_in_a_shared_start(models, tmp_path):
    """Each artifact of one harness start has the class's whole timeout: a looping candidate (first) is killed at
    its own, and the reference after it still runs and keeps its result (not "timed out" too)."""
    dc = kit.device_class(ONNX_CLASS, timeout_s=3)
    data = kit.eval_data(tmp_path / "eval.npz", n=8)
    jobs = [Job(dc, data, tmp_path / "cand", artifact_path=kit.looping(tmp_path / "loop.onnx"), role="candidate"),
            Job(dc, data, tmp_path / "ref", artifact_path=models["mlp"], role="reference")]
    cand, ref = execute_group(jobs, LocalProcessBackend())
    assert not cand.ok and cand.reason == "timed out after 3 s"
    assert ref.ok, ref.reason
    np.testing.assert_allclose(results.load_outputs(tmp_path / "ref")["y"], kit.host_onnx(models["mlp"], data)["y"],
                               rtol=1e-6)
    args = harness_command(jobs, ["m1", "m2"], "d", ["o1", "o2"])
    assert args[args.index("--timeout") + 1] == "3" and "--timeout" not in harness_command(jobs[:1], ["m"], "d", ["o"])


def test_batched_calls_made_at_once_by_several_threads_equal_one_threads(models, tmp_path):
    """--eval-workers: the batched calls of every artifact of a start spread over threads (onnxruntime), from a
    schedule fixed by the samples, the batch and the workers: the outputs are one thread's on that schedule, each
    artifact keeps its own result, and the timed single calls are untouched."""
    from fakes import harness

    data = kit.eval_data(tmp_path / "eval.npz", n=150)
    runs = {}
    for workers in (1, 3):
        jobs = [_job(models[name], data, tmp_path / f"{name}-{workers}", role=role, eval_batch=16, latency_calls=4,
                     eval_workers=workers) for name, role in (("mlp", "candidate"), ("mlp_v2", "reference"))]
        runs[workers] = execute_group(jobs, LocalProcessBackend())
        assert all(r.ok for r in runs[workers]), [r.reason for r in runs[workers]]
    schedule = harness()._plugin("harness_batched").eval_schedule(150, 16, 3)
    assert schedule[0] == (0, 16) and schedule[-1][1] == 150 and len(schedule) > 150 // 16
    for one, three in zip(*runs.values()):
        assert "eval_workers" not in one.extra["evaluation"]
        ev = three.extra["evaluation"]
        assert ev["batched"] and ev["eval_workers"] == 3 and ev["eval_calls"] == len(schedule)
        assert 1 <= ev["eval_at_once"] <= 3 and ev["checked_samples"] == 4 and len(three.latencies_ns) == 4
    for name in ("mlp", "mlp_v2"):
        got = results.load_outputs(tmp_path / f"{name}-3")["y"]
        np.testing.assert_allclose(got, kit.host_onnx(models[name], data)["y"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, results.load_outputs(tmp_path / f"{name}-1")["y"], rtol=1e-5, atol=1e-6)


def test_the_eval_schedule_covers_every_sample_once_and_ends_in_small_calls():
    from fakes import harness

    h = harness()._plugin("harness_batched")
    assert h.eval_schedule(400, 64, 1) == harness().slices(400, 64)
    for n, batch, workers in ((400, 64, 2), (401, 64, 4), (9, 64, 2), (1000, 16, 2), (64, 64, 2)):
        spans = h.eval_schedule(n, batch, workers)
        assert spans == h.eval_schedule(n, batch, workers)                  # fixed by its arguments alone
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))          # contiguous, each sample once
        sizes = [b - a for a, b in spans]
        assert max(sizes) <= batch and sizes[-1] == 1                       # down to single samples at the end
        assert sizes == sorted(sizes, reverse=True)                         # the small calls come last
        assert all(size >= min(batch, -(-(n - a) // (2 * workers))) for (a, _), size in zip(spans, sizes))
    assert len(h.eval_schedule(400, 64, 2)) <= 25                           # shrinking costs few calls


class _Runner:
    concurrent = True


def test_call_slots_bound_the_calls_at_once_and_a_grant_adds_one():
    """CallSlots: three threads with one slot make one call at a time; a grant (the host's SIGUSR1) lets a second
    run beside it; never more than allowed. The order is made, not timed: the first four calls run alone (one
    slot), the fourth grants the second slot and holds its own until another call has started beside it."""
    import threading
    import time

    from fakes import harness

    h = harness()._plugin("harness_batched")
    slots = h.CallSlots(1, 2)
    now, most, lock, beside = [0], [0], threading.Lock(), threading.Event()
    before_grant = []

    def call(i, span):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
            if now[0] > 1:
                beside.set()
        if i == 3:
            before_grant.append(most[0])
            slots.grant()
            assert beside.wait(timeout=30), "no call started beside the one holding the first slot"
        time.sleep(0.01)
        with lock:
            now[0] -= 1
    spans = [(i, i + 1) for i in range(12)]
    claimed = []
    at_once = h.concurrent_calls(_Runner(), spans, call, 3, slots, last_claimed=lambda: claimed.append(True))
    assert before_grant == [1] and at_once == most[0] == 2 and claimed == [True]
    slots.grant()
    assert slots.allowed() == 2                       # at most `most`


def test_a_slot_held_by_a_process_that_dies_is_free_again():
    import os

    from fakes import harness

    slots = harness()._plugin("harness_batched").CallSlots(1, 1)
    pid = os.fork()
    if pid == 0:
        slots.take()                                 # held, never closed: the process dies holding it
        os._exit(0)
    os.waitpid(pid, 0)
    fd = slots.take()                                # would wait forever if the lock had died with it
    os.close(fd)


def test_the_batched_calls_shrink_until_the_workers_calls_fit_in_memory_at_once(monkeypatch):
    """fitting_batch (issue 46): PP-OCRv4's detector under QEMU takes 24 MB a sample; with 1.5 GB of room two
    calls of 64 (or 32) at once would not fit, two of 16 do, so the workers make calls of 16 side by side rather
    than one call of 64 at a time. One worker, unknown memory or no limit: the class's batch as it is."""
    from fakes import harness

    memory, mb = harness()._plugin("harness_memory"), 2 ** 20
    monkeypatch.setattr(memory, "cgroup_room", lambda: 1500 * mb)
    assert memory.fitting_batch(24 * mb, 64, 1, 2) == 16
    assert memory.fitting_batch(24 * mb, 64, 1, 1) == 64 and memory.fitting_batch(None, 64, 1, 2) == 64
    assert memory.fitting_batch(1 * mb, 64, 1, 2) == 64 and memory.fitting_batch(10 ** 12, 64, 4, 2) == 4
    monkeypatch.setattr(memory, "cgroup_room", lambda: None)
    assert memory.fitting_batch(24 * mb, 64, 1, 2) == 64


def test_a_call_runs_beside_another_only_where_its_memory_fits_under_the_limit(monkeypatch):
    """call_room: the single call's inference memory scaled to the batched call (x 1.5) must be free under the
    container's limit (harness_memory.cgroup_room); unknown memory: one call at a time; no limit: any. And
    concurrent_calls makes no call beside another while room() says no."""
    import threading
    import time

    from fakes import harness

    h = harness()._plugin("harness_batched")
    memory = harness()._plugin("harness_memory")
    monkeypatch.setattr(memory, "cgroup_room", lambda: 960)
    assert memory.call_room(10, 64, 1)() and not memory.call_room(11, 64, 1)() and not memory.call_room(None, 64, 1)()
    monkeypatch.setattr(memory, "cgroup_room", lambda: None)
    assert memory.call_room(10 ** 12, 64, 1)() and memory.call_room(None, 64, 1)()

    for fits, want in ((False, 1), (True, 3)):
        now, most, lock = [0], [0], threading.Lock()
        together = threading.Barrier(3, timeout=30)    # room: the first three calls wait for each other

        def call(i, span):
            with lock:
                now[0] += 1
                most[0] = max(most[0], now[0])
            if fits and i < 3:
                together.wait()
            time.sleep(0.01)
            with lock:
                now[0] -= 1
        at_once = h.concurrent_calls(_Runner(), [(i, i + 1) for i in range(9)], call, 3, h.CallSlots(3, 3),
                                     room=lambda: fits)
        assert at_once == most[0] == want


def test_a_describe_beside_the_batched_calls_gives_the_describe_after_the_run(models, tmp_path):
    """--describe with batched calls at once (--eval-workers): the candidate's describe runs in a process of its own
    beside its batched calls (harness_after.DescribeBeside), and writes the same description as the describe after
    the result (one worker: no call slots), with the run's figures and outputs those of a run without it."""
    import json

    data = kit.eval_data(tmp_path / "eval.npz", n=150)
    described = {}
    for workers in (1, 2):
        jobs = [_job(models["mlp_v2"], data, tmp_path / f"ref-{workers}", role="reference", eval_batch=16,
                     latency_calls=4, eval_workers=workers),
                _job(models["mlp"], data, tmp_path / f"cand-{workers}", role="candidate", eval_batch=16,
                     latency_calls=4, eval_workers=workers, describe=True)]
        ran = execute_group(jobs, LocalProcessBackend())
        assert all(r.ok for r in ran), [r.reason for r in ran]
        assert not (tmp_path / f"ref-{workers}" / "describe.json").exists()
        described[workers] = json.loads((tmp_path / f"cand-{workers}" / "describe.json").read_text())
        assert ran[1].extra["evaluation"].get("eval_workers", 1) == workers
    after, beside = described[1], described[2]
    assert after["ok"] and beside["ok"]
    level = after["default_level"]
    for field in ("default_level", "providers", "machine", "versions", "transformers"):
        assert beside[field] == after[field], field
    assert beside["levels"][level]["nodes"] == after["levels"][level]["nodes"]
    assert beside["levels"][level]["placement"] == after["levels"][level]["placement"]
    np.testing.assert_allclose(results.load_outputs(tmp_path / "cand-2")["y"],
                               results.load_outputs(tmp_path / "cand-1")["y"], rtol=1e-5, atol=1e-6)


def _hold_slot(slots):
    """One of `slots` held by a process of its own until the returned function is called (a slot held in this
    process would be inherited, and held, by every process forked from it meanwhile)."""
    import os

    taken_r, taken_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        slots.take()
        os.write(taken_w, b"t")
        os.read(go_r, 1)
        os._exit(0)
    assert os.read(taken_r, 1) == b"t"

    def release():
        os.write(go_w, b"g")
        os.waitpid(pid, 0)
        for fd in (taken_r, taken_w, go_r, go_w):
            os.close(fd)
    return release


def test_a_describe_beside_waits_for_a_call_slot_and_one_that_dies_leaves_no_description(models, tmp_path):
    """DescribeBeside holds a call slot like a batched call: while the container's only slot is held, it does not
    describe; given the slot, it does. A describe process killed mid-way leaves no describe.json (the host then
    describes the artifact in a container of its own)."""
    import argparse
    import json
    import os
    import signal
    import time

    from fakes import harness

    after = harness()._plugin("harness_after")
    slots = harness()._plugin("harness_batched").CallSlots(1, 1)
    args = argparse.Namespace(runtime="onnxruntime", model=str(models["mlp"]), out=str(tmp_path / "out"), threads=1,
                              disabled_passes=[], slots=slots)
    os.makedirs(args.out)
    assert after.describe_beside(args, False) is None
    assert after.describe_beside(argparse.Namespace(**{**vars(args), "slots": None}), True) is None
    release = _hold_slot(slots)
    beside = after.describe_beside(args, True)
    beside.after_timed_loop(None, None)
    time.sleep(1.0)
    assert not os.path.exists(os.path.join(args.out, "describe.json"))      # waiting for the slot
    release()
    beside.finish()
    assert json.loads((tmp_path / "out" / "describe.json").read_text())["ok"]

    release = _hold_slot(slots)                # the next one waits for the slot: killed there, it described nothing
    killed = after.describe_beside(args, True)
    killed.after_timed_loop(None, None)
    os.kill(killed.pid, signal.SIGKILL)
    killed.finish()
    release()
    assert not (tmp_path / "out" / "describe.json").exists()


def test_the_harness_waits_for_its_data_ready_file_and_gives_up_saying_so(tmp_path, capsys):
    """--data-ready FILE (the Docker backend copies the data in while the harness starts): the harness returns once
    FILE exists, and after its limit without it exits 2 with one line naming the file."""
    import threading
    import time

    import pytest

    from fakes import harness

    ready = tmp_path / ".ready"
    timer = threading.Timer(0.5, ready.touch)
    timer.start()
    t0 = time.monotonic()
    harness().wait_for(str(ready), limit_s=30)
    assert ready.exists() and time.monotonic() - t0 >= 0.4
    harness().wait_for("")                                  # none asked for: at once
    with pytest.raises(SystemExit) as exc:
        harness().wait_for(str(tmp_path / "never"), limit_s=0.2)
    assert exc.value.code == 2 and "never did not appear within 0.2 s" in capsys.readouterr().err


def test_a_tar_for_a_volume_is_readable_by_anyone_and_ends_with_its_ready_file(models, tmp_path):
    import io
    import tarfile

    from tiergate.execution.docker_backend import readonly_tar

    tar = tarfile.open(fileobj=io.BytesIO(readonly_tar([(models["mlp"], "m/model.onnx")], ".ready")))
    members = tar.getmembers()
    assert [m.name for m in members] == ["m/model.onnx", ".ready"] and members[1].size == 0
    assert all(m.mode == 0o444 and m.uid == 0 for m in members)
    assert tar.extractfile(members[0]).read() == models["mlp"].read_bytes()


def test_the_next_artifact_starts_beside_the_first_where_a_call_slot_is_free_else_after_it(tmp_path):
    """harness_children.run_each with call slots: the next artifact's child waits for the previous one's last round
    of calls (here it never says so: it ends) unless more call slots are granted than artifacts started, where its
    start (load, single calls) takes the free core at once. The first child waits for the second's start: with
    a free slot it sees it (it waits up to a minute), with none the second cannot start before the first ends."""
    import argparse
    import os
    import time

    from fakes import harness

    children, slots_of = harness()._plugin("harness_children"), harness()._plugin("harness_batched").CallSlots

    for granted, beside, patience in ((2, True, 60.0), (1, False, 2.0)):
        outs = [str(tmp_path / f"{granted}-{n}") for n in range(2)]

        def work(args, outs=outs, patience=patience):
            if args.out == outs[1]:
                open(os.path.join(args.out, "started"), "w").close()
                return
            deadline, other = time.monotonic() + patience, os.path.join(outs[1], "started")
            while not os.path.exists(other) and time.monotonic() < deadline:
                time.sleep(0.01)
            with open(os.path.join(args.out, "saw"), "w") as fh:
                fh.write(str(os.path.exists(other)))

        args = argparse.Namespace(models=["a", "b"], outs=outs, describe=[], disabled_of={}, pair_model=[],
                                  pair_index=0, timeout=0, slots=slots_of(granted, 2))
        children.run_each(args, work)
        assert open(os.path.join(outs[0], "saw")).read() == str(beside), granted
        assert os.path.exists(os.path.join(outs[1], "started"))

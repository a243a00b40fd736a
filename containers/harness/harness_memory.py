"""Peak memory of the harness process, read from the kernel (never estimated).

Imported by tiergate_harness.py on every run (the device figures are part of every
result). It reads, at four points outside any timed region:

  before_load       the runtime library is imported (so its import is not "loading"),
                    then RSS is read and the peak (VmHWM) is reset;
  loaded            VmHWM = the peak while the session/interpreter was created;
                    RSS is read and the peak is reset again;
  before_inference  (nothing: the inputs are prepared; the reset above covers them)
  after_timed_loop  VmHWM = the peak of the first call, warm-up and timed loop;
                    the container's cgroup peak (memory.peak on cgroup v2,
                    memory.max_usage_in_bytes on v1) when the run has its own
                    container (TIERGATE_IN_CONTAINER, set by the Docker backend).

Sources: /proc/self/status (VmRSS, VmHWM) and /proc/self/clear_refs ("5" resets
VmHWM to the current RSS, Linux >= 4.0). Where the reset is refused the figures
stay valid as lower bounds (VmHWM only grows) and memory.reset says so.

Under QEMU user mode these are the QEMU process's figures: they include the
emulator and its translation cache (the host labels them emulated).

Written to result.json's device table:
  peak_memory_bytes       the process's peak resident memory over the whole run
  baseline_memory_bytes   RSS before loading (Python, numpy, the runtime library, the data)
  load_memory_bytes       added by loading: peak during load - RSS before it
  inference_memory_bytes  added by inference: peak during inference - RSS after loading
  cgroup_peak_bytes       the container's cgroup peak (includes page cache), or null (no container of its
                          own: a local process, or several artifacts in one container)
  memory_source           where the figures come from
"""

from __future__ import annotations

import importlib
import os

STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"
CGROUP_PEAK = ("/sys/fs/cgroup/memory.peak",                      # cgroup v2
               "/sys/fs/cgroup/memory/memory.max_usage_in_bytes")  # cgroup v1
RUNTIME_MODULE = {"onnxruntime": "onnxruntime", "onnxruntime-gpu": "onnxruntime",
                  "tflite": "ai_edge_litert.interpreter", "tvm": "tvm", "ethos-u": "ai_edge_litert.interpreter"}


def status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes."""
    found = {}
    with open(STATUS) as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) * 1024   # the kernel writes kB
    return found


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS; False where the kernel refuses it."""
    try:
        with open(CLEAR_REFS, "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def in_container() -> bool:
    """Set by tiergate's Docker backend: the cgroup is the run's own (a local process shares the host's)."""
    return bool(os.environ.get("TIERGATE_IN_CONTAINER"))


SHARED_ENV = "TIERGATE_SHARED_CONTAINER"   # set by the harness when several artifacts run in one container


def cgroup_peak() -> tuple[int | None, str]:
    """The container's cgroup memory peak and its file; (None, "") outside a container or without one, and
    when several artifacts share the container (its peak is theirs together, not this artifact's)."""
    if not in_container() or os.environ.get(SHARED_ENV):
        return None, ""
    for path in CGROUP_PEAK:
        try:
            with open(path) as fh:
                return int(fh.read().strip()), path
        except (OSError, ValueError):
            continue
    return None, ""


CGROUP_ROOM = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),                   # cgroup v2
               ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def cgroup_room() -> int | None:
    """Bytes the container may still take before its memory limit (the device's: an out-of-memory finding past
    it), page cache counted as used; None outside a container, or without a limit."""
    if not in_container():
        return None
    for limit_path, used_path in CGROUP_ROOM:
        try:
            with open(limit_path) as fh:
                limit = fh.read().strip()
            with open(used_path) as fh:
                used = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:
            return None
        return int(limit) - used
    return None


class MemoryHook:
    def __init__(self):
        self.reset_ok = True
        self.before = self.after_load = None
        self.peaks: list[int] = []

    def before_load(self, args):
        importlib.import_module(RUNTIME_MODULE[args.runtime])   # the library's import is not the model's load
        self.before = status()
        self.reset_ok = reset_peak() and self.reset_ok

    def loaded(self, runner):
        self.after_load = status()
        self.peaks.append(self.after_load["VmHWM"])
        self.reset_ok = reset_peak() and self.reset_ok

    def after_timed_loop(self, runner, feeds):
        end = status()
        self.peaks.append(end["VmHWM"])
        before, loaded = self.before, self.after_load
        # without a reset VmHWM holds the earlier peak too: subtract the peak known before instead of the RSS
        load_base = before["VmRSS"] if self.reset_ok else before["VmHWM"]
        infer_base = loaded["VmRSS"] if self.reset_ok else loaded["VmHWM"]
        peak, path = cgroup_peak()
        runner.device.update(
            peak_memory_bytes=max([before["VmHWM"], *self.peaks]),
            baseline_memory_bytes=before["VmRSS"],
            load_memory_bytes=max(0, loaded["VmHWM"] - load_base),
            inference_memory_bytes=max(0, end["VmHWM"] - infer_base),
            cgroup_peak_bytes=peak,
            memory_source="/proc/self/status VmHWM" + (f" + {path}" if path else "")
                          + ("" if self.reset_ok else " (peak reset refused: shares are lower bounds)"),
        )


def hook():
    return MemoryHook()


ROOM_MARGIN = 1.5     # a call beside another needs this many times its estimated memory free under the limit


def call_room(single_bytes, eval_batch, batch):
    """room(): whether one more batched call fits under the container's memory limit (the device's memory: the
    calls at once must never make an out-of-memory finding that one call at a time would not). A call's memory is
    estimated from the single calls' (inference_memory_bytes) scaled to the batched call's samples; unknown, no
    call runs beside another. Outside a container, or without a limit: always."""
    need = None if single_bytes is None else single_bytes * eval_batch / max(batch, 1) * ROOM_MARGIN

    def room():
        left = cgroup_room()
        return left is None or (need is not None and left >= need)
    return room


def fitting_batch(single_bytes, eval_batch, batch, workers):
    """The batched calls' size: `eval_batch`, halved (down to `batch`) while `workers` calls of it at once would
    not fit in the container's room (call_room's estimate): a large model's calls then run side by side on the
    cores rather than one large call at a time (PP-OCRv4's detector at 320 x 320 under QEMU: 24 MB a sample, so
    calls of 16, two at once, under a 2 GB limit, not calls of 64 one at a time). Unknown memory, one worker, or
    no limit: `eval_batch`."""
    room = cgroup_room() if workers > 1 and single_bytes else None
    size = eval_batch
    while room is not None and size > batch and workers * single_bytes * size / max(batch, 1) * ROOM_MARGIN > room:
        size //= 2
    return max(size, batch)

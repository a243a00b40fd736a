"""Shared test plumbing: the parts a test needs, checked before it runs.

Strict by default, inside CI or not: the first test marked `docker`, `emulated`, `ssh`, `counting` (the counting
QEMU scripts/setup builds), `chromium` (Debian's chromium and playwright) or `root` (mounts, files planted as
another user) on a machine without that part STOPS THE RUN (exit 2) with the cause (none of them is optional for
this project), and a part found missing inside a test (a mount the kernel refuses: partskit.missing_part) fails it.
`TIERGATE_ALLOW_SKIP=1` relaxes that to skips, for a laptop. Only a missing GPU (`gpu`) always skips, with its
reason, and so does a missing optional tflite extra (`tflite_extra`), and a test about a CPU feature the machine
does not have (NCHWc kernels need AVX2) or a GPU runtime it has. A probe's success is remembered for the session,
a failure never is: the next test asks again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

ALLOW_SKIP = os.environ.get("TIERGATE_ALLOW_SKIP", "").lower() in ("1", "true", "yes")
# Prefect reads its settings once, when it is first imported: a test's monkeypatch comes too late. A temporary
# server's first start in a fresh venv (its modules compiled, its database migrated) on a loaded 2-core machine
# took longer than Prefect's default 20 s; give every temporary server of the run 180 s.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # parallel workers (make test): each its own Prefect home, so that two temporary servers never share one
    # SQLite database (a test that wants another home sets PREFECT_HOME itself)
    import tempfile

    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix=f"tiergate-test-prefect-"
                                                                  f"{os.environ['PYTEST_XDIST_WORKER']}-"))
RELAX_HINT = "set TIERGATE_ALLOW_SKIP=1 to skip these tests instead"


def _thread_start_survives_coverage() -> None:
    """Python 3.11 under coverage (make test): two threads starting at once both install coverage's trace hook,
    and the loser dies in threading's bootstrap before running anything ("Cannot install a trace function while
    another trace function is being installed": a process-wide guard in CPython's _PyEval_SetTrace,
    python/cpython#98257). Seen here as a test's socket proxy whose pipe thread never ran (the engine call then
    waited out its 120 s). In the test processes only, the bootstrap's install retries instead of raising;
    Python 3.12 and later (coverage on sys.monitoring) need nothing."""
    import sys
    import threading
    import time

    if sys.version_info >= (3, 12) or getattr(threading, "_sys", None) is not sys:
        return

    class _Sys:
        def __getattr__(self, name):
            return getattr(sys, name)

        @staticmethod
        def settrace(func):
            for _ in range(2000):
                try:
                    return sys.settrace(func)
                except RuntimeError as exc:
                    if "another trace function" not in str(exc):
                        raise
                    time.sleep(0.0005)
            return sys.settrace(func)

    threading._sys = _Sys()


_thread_start_survives_coverage()
SSHD = "/usr/sbin/sshd"
EXIT_MISSING_PART = 2   # the run stops at the first test that needs a missing part


def _cache_success(probe: Callable[[], str | None]) -> Callable[[], str | None]:
    """Run `probe` until it reports no problem once; from then on answer None without asking."""
    passed = False

    def checked() -> str | None:
        nonlocal passed
        if passed:
            return None
        problem = probe()
        passed = problem is None
        return problem

    checked.__name__ = probe.__name__
    return checked


@_cache_success
def _engine_problem() -> str | None:
    host = os.environ.get("DOCKER_HOST", "the default socket")
    try:
        import docker

        client = docker.from_env(timeout=10)
        try:
            client.ping()
        finally:
            client.close()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means no engine
        return f"no Docker engine answers at {host} ({type(exc).__name__}: {exc}); start it (scripts/setup)"


@_cache_success
def _emulation_problem() -> str | None:
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if not entry.exists() or not entry.read_text().startswith("enabled"):
        return f"arm64 emulation is not registered with binfmt_misc ({entry} absent or disabled); run scripts/setup"
    return None


@_cache_success
def _sshd_problem() -> str | None:
    if not os.path.exists(SSHD) and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "RUNLEVEL": "1"}  # RUNLEVEL=1: do not start it
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "openssh-server"],
                       env=env, capture_output=True, timeout=600)
    if not os.path.exists(SSHD) or not shutil.which("ssh-keygen"):
        return "no OpenSSH server (apt-get install openssh-server)"
    return None


@_cache_success
def _gpu_problem() -> str | None:
    if not shutil.which("nvidia-smi"):
        return "no NVIDIA GPU on this machine (nvidia-smi not found)"
    return None


@_cache_success
def _counting_problem() -> str | None:
    from tiergate.execution.counting import count_dir, counter

    if counter() is None:
        return f"no counting QEMU in {count_dir()}: run scripts/build-counting-qemu (scripts/setup does)"
    return None


@_cache_success
def _chromium_problem() -> str | None:
    import importlib.util

    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        return "Debian's chromium is not installed (scripts/setup installs it)"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (scripts/setup installs the pinned dependencies)"
    return None


@_cache_success
def _root_problem() -> str | None:
    return None if os.geteuid() == 0 else "the test mounts file systems or plants files as another user: run as root"


def _tflite_extra_problem() -> str | None:
    import modelkit

    return modelkit.tflite_extra_problem()


# marker -> (probes, required): a required part fails the test when absent, unless TIERGATE_ALLOW_SKIP=1
NEEDS: dict[str, tuple[tuple[Callable[[], str | None], ...], bool]] = {
    "docker": ((_engine_problem,), True),
    "emulated": ((_emulation_problem, _engine_problem), True),
    "ssh": ((_sshd_problem,), True),
    "counting": ((_counting_problem,), True),
    "chromium": ((_chromium_problem,), True),
    "root": ((_root_problem,), True),
    "gpu": ((_gpu_problem,), False),
    "tflite_extra": ((_tflite_extra_problem,), False),
}


def pytest_runtest_setup(item: pytest.Item) -> None:
    marked = {m.name for m in item.iter_markers()}
    for marker, (probes, required) in NEEDS.items():
        if marker not in marked:
            continue
        for probe in probes:
            problem = probe()
            if problem is None:
                continue
            if required and not ALLOW_SKIP:   # stop the whole run here, with the cause: no green summary
                pytest.exit(f"{marker} test cannot run: {problem} ({RELAX_HINT})", returncode=EXIT_MISSING_PART)
            pytest.skip(problem)


@pytest.fixture
def tiergate_home(tmp_path, monkeypatch) -> Path:
    """A private TIERGATE_HOME (registry, store, results) for one test."""
    home = tmp_path / "tiergate-home"
    monkeypatch.setenv("TIERGATE_HOME", str(home))
    return home


def pytest_configure(config: pytest.Config) -> None:
    """The cache-seal key (state.cache_key) of this test session, outside every test's home and not the
    user's own (~/.config/tiergate/cache.key): a test that wants another key sets TIERGATE_CACHE_KEY itself."""
    if "TIERGATE_CACHE_KEY" not in os.environ:
        import tempfile

        folder = tempfile.mkdtemp(prefix="tiergate-test-key-")
        os.environ["TIERGATE_CACHE_KEY"] = os.path.join(folder, "cache.key")


# --- parallel runs (pytest-xdist, `make test`: -n 2 --dist loadgroup) ----------------------------------------------
# Each test module is one unit of work for a worker, except the folders whose session fixtures are worth sharing
# across their modules (one TIERGATE_HOME of real-model reference runs, one compile cache, one filled registry,
# one PostgreSQL server, one Prefect demo): those folders are one unit each. Units are handed out heaviest first
# (the measured seconds below, from a serial run: a unit not listed counts as light), so the longest unit starts
# at once and the rest fills the other worker around it. What the workers share is shared as gates share it: the
# Docker engine (images built once under their build lock, leases.building), the wheel and model caches (locked).
SHARED_FOLDERS = ("realmodels", "tvm", "reports", "registry", "flows", "mlflow", "npu")
# seconds, serial `make test` of 2026-11-26 (--durations=0, setup + call + teardown per unit; 2,018 s in all)
HEAVY_UNITS: dict[str, float] = {
    "realmodels": 638, "flows": 248, "pipeline/test_demo.py": 100, "registry": 90, "reports": 87,
    "faults/test_faults_registry.py": 72, "gc/test_gc_docker.py": 49, "artifact/test_onnx_corpus.py": 49,
    "faults/test_faults_docker.py": 49, "gate/test_paired_coverage.py": 47, "tvm": 43,
    "execution/test_execution_build.py": 43, "explain/test_explain_flow.py": 34, "explain/test_explain_tiers.py": 33,
    "execution/test_execution_docker.py": 32, "mlflow": 29, "execution/test_execution_local.py": 24,
    "npu": 50,     # measured 2026-11-27 alone (images built; the Vela compiler image adds ~10 s once)
    # issue 46, measured 2026-11-27 alone on a loaded host: the pool's shares (flows/test_flows_pool_shares.py,
    # 270 s: a Prefect server, a second dockerd with the arm64 images, two workers) and the real detector's tiers
    "tasks/test_tasks_ocr_tiers.py": 136,
}
HEAVY_UNITS["flows"] += 270


def _unit(item: pytest.Item) -> str:
    parts = Path(str(item.fspath)).relative_to(Path(__file__).parent).parts
    return parts[0] if len(parts) > 1 and parts[0] in SHARED_FOLDERS else "/".join(parts)


def _grouped(config: pytest.Config) -> bool:
    """Whether the run hands out units (--dist loadgroup). The items are collected in the xdist workers, where
    xdist has reset `dist` to "no" and `numprocesses` to None and kept the choice as `loadgroup`: asked only of
    those two options, every worker answered no, no test had a group, and each test went to whichever worker was
    free (a module's tests in both at once: one removed an image another was running)."""
    if hasattr(config, "workerinput"):
        return bool(config.getoption("loadgroup", False))
    return bool(getattr(config.option, "numprocesses", None)) and getattr(config.option, "dist", "no") == "loadgroup"


@pytest.hookimpl(tryfirst=True)      # before xdist's own hook reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _grouped(config):
        for item in items:
            item.add_marker(pytest.mark.xdist_group(_unit(item)))


# after pytest's own ordering by fixture scope (each unit keeps the serial order), before xdist's own hook sends the
# worker's collection
@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    if not _grouped(session.config):
        return
    items = session.items
    ungrouped = [item.nodeid for item in items if not item.nodeid.endswith("@" + _unit(item))]
    if ungrouped:
        # xdist reads a test's unit from the "@unit" it appends to the test's id; an id without it is scheduled
        # alone, and the tests of one unit would run in both workers at once (pytest 9.2 with xdist 3.8:
        # pytest-dev/pytest-xdist#1386)
        raise pytest.UsageError(f"--dist loadgroup does not group here: {ungrouped[0]} has no unit in its id "
                                f"(pytest {pytest.__version__}); run with PYTEST_WORKERS= or pin a pytest it works with")
    first = {}
    for i, item in enumerate(items):
        first.setdefault(_unit(item), i)
    items.sort(key=lambda item: (-HEAVY_UNITS.get(_unit(item), 0.0), first[_unit(item)]))

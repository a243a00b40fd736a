"""Containers and volumes owned by a gate process: labelled, removed on a signal, swept when orphaned.

Every container and volume the Docker backend creates carries owner labels
(`org.tiergate.owner.host`, `.owner.pid`, `.owner.start`: the process's start
time, so that a reused PID is not taken for the owner).

- `sweep(docker_hosts)` removes tiergate containers and volumes whose owner ran on
  this host and is gone (a gate killed with SIGKILL, a crashed CI runner). The
  gate calls it at start; `tiergate gc` calls it too.
- `install_signal_handlers()` makes SIGINT and SIGTERM stop the gate: no new
  container starts (`check_stop()` / `stopping()`), the process's own containers
  and volumes are removed at once, and `Interrupted` (exit 130/143) is raised in
  the main thread. Finished run folders are kept (they are complete and verified).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from dataclasses import dataclass, field

from tiergate.errors import InfrastructureFault, Interrupted
from tiergate.images import LABEL

OWNER_HOST = f"{LABEL}.owner.host"
OWNER_PID = f"{LABEL}.owner.pid"
OWNER_START = f"{LABEL}.owner.start"

_STOP = threading.Event()
_STATE: dict = {"signum": 0, "hosts": set(), "finished": 0}
_GUARD = threading.Lock()


def hostname() -> str:
    return socket.gethostname()


def process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), '' when unknown."""
    try:
        stat = open(f"/proc/{pid}/stat", encoding="ascii", errors="replace").read()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def owner_labels() -> dict[str, str]:
    """The labels naming this process as the owner of a container or volume."""
    pid = os.getpid()
    return {OWNER_HOST: hostname(), OWNER_PID: str(pid), OWNER_START: process_start(pid)}


def owner_alive(labels: dict[str, str]) -> bool:
    """Whether the process named by owner labels still runs (on this host); unknown owners count as alive."""
    try:
        pid = int(labels.get(OWNER_PID, ""))
    except ValueError:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    started = labels.get(OWNER_START, "")
    return not started or process_start(pid) in ("", started)


# --- stopping on a signal ---------------------------------------------------------------


def stopping() -> bool:
    return _STOP.is_set()


def check_stop() -> None:
    """Raise Interrupted once a stop was asked: called before anything is launched."""
    if _STOP.is_set():
        raise Interrupted(_STATE["signum"])


def note_engine(docker_host: str) -> None:
    """Remember an engine this process started containers on (removed from there on a stop)."""
    with _GUARD:
        _STATE["hosts"].add(docker_host or "local")


def note_finished() -> None:
    """One more run folder finished (and kept) in this process."""
    with _GUARD:
        _STATE["finished"] += 1


def finished() -> int:
    return _STATE["finished"]


def install_signal_handlers() -> None:
    """SIGINT and SIGTERM stop the gate (call from the main thread, before the gate starts)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal)


def reset() -> None:
    """Forget a stop (tests, and long-lived processes that handle one and go on)."""
    _STOP.clear()
    with _GUARD:
        _STATE.update(signum=0, hosts=set(), finished=0)


def _on_signal(signum, _frame) -> None:
    if _STOP.is_set():
        return                          # already stopping: a second Ctrl-C must not interrupt the cleanup
    _STATE["signum"] = signum
    _STOP.set()
    removed = remove_own()
    raise Interrupted(signum, removed)


def remove_own() -> str:
    """Remove this process's containers and volumes on every engine it used; says what went."""
    with _GUARD:
        hosts = sorted(_STATE["hosts"])
    swept = Swept()
    for docker_host in hosts:
        swept += _sweep_one(docker_host, lambda labels: labels.get(OWNER_PID) == str(os.getpid()))
    return swept.text()


# --- sweeping orphans -----------------------------------------------------------------


@dataclass
class Swept:
    containers: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def __iadd__(self, other: "Swept") -> "Swept":
        self.containers += other.containers
        self.volumes += other.volumes
        self.problems += other.problems
        return self

    def text(self) -> str:
        return f"{len(self.containers)} container(s) and {len(self.volumes)} volume(s) removed"


def sweep(docker_hosts=("local",)) -> Swept:
    """Remove tiergate containers and volumes whose owner process (on this host) is gone.

    Best effort: an engine that does not answer is skipped (and named in `problems`);
    containers of live processes, of other hosts, or without owner labels are left alone.
    """
    swept = Swept()
    for docker_host in sorted(set(docker_hosts)):
        swept += _sweep_one(docker_host, lambda labels: not owner_alive(labels))
    return swept


def _sweep_one(docker_host: str, doomed) -> Swept:
    import docker

    from tiergate.execution.engine import connect

    swept = Swept()
    try:
        client = connect(docker_host)
    except InfrastructureFault as exc:
        swept.problems.append(exc.one_line())
        return swept
    here = [f"{OWNER_HOST}={hostname()}"]
    try:
        for container in client.containers.list(all=True, filters={"label": here}):
            if doomed(container.labels):
                try:
                    container.remove(force=True)
                    swept.containers.append(container.name)
                except docker.errors.APIError as exc:
                    swept.problems.append(f"container {container.name}: {exc.explanation or exc}")
        for volume in client.volumes.list(filters={"label": here}):
            if doomed(volume.attrs.get("Labels") or {}):
                try:
                    volume.remove(force=True)
                    swept.volumes.append(volume.name)
                except docker.errors.APIError as exc:
                    swept.problems.append(f"volume {volume.name}: {exc.explanation or exc}")
    except Exception as exc:  # noqa: BLE001 - a sweep never fails the caller
        swept.problems.append(f"{docker_host}: {type(exc).__name__}: {exc}")
    finally:
        client.close()
    return swept

"""Real parts for the flow tests: a Prefect server, `tiergate serve`, a worker, a second Docker engine.

Everything started here listens on 127.0.0.1 (or a unix socket under a tmp folder)
and is stopped by its process group id, with a SIGKILL fallback.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from servekit import untraced

REPO = Path(__file__).resolve().parents[2]
TIERGATE = Path(sys.executable).parent / "tiergate"
PREFECT = Path(sys.executable).parent / "prefect"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(args: list, log: Path, env: dict, cwd: Path = REPO) -> subprocess.Popen:
    """A process in its own group (so stop() ends its children too), output to a log file."""
    with open(log, "ab") as out:
        return subprocess.Popen([str(a) for a in args], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)


def stop(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGTERM the process group, then SIGKILL what is left."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc, signal.SIGKILL)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.5, proc=None, log: Path | None = None):
    """Poll until predicate() is truthy; its value. Fails with the log's tail on timeout or early exit."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: process exited {proc.returncode}\n{tail(log)}")
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{tail(log)}")


def tail(log: Path | None, lines: int = 40) -> str:
    if log is None or not log.exists():
        return ""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def prefect_env(base: dict, prefect_home: Path, api_url: str) -> dict:
    return {**base, "PREFECT_HOME": str(prefect_home), "PREFECT_API_URL": api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOCAL_STORAGE_PATH": str(prefect_home / "storage"),
            "PREFECT_LOGGING_LEVEL": "INFO"}


@contextmanager
def prefect_server(folder: Path):
    """`prefect server start` on 127.0.0.1 with its own SQLite database; yields (api_url, env)."""
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = prefect_env(dict(os.environ), folder / "prefect-home", api_url)
    env["PREFECT_API_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{folder / 'prefect.db'}"
    log = folder / "prefect-server.log"
    proc = start([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", port], log, untraced(env))
    try:
        wait_for(lambda: healthy(api_url), 120, "the Prefect server", proc=proc, log=log)
        yield api_url, env
    finally:
        stop(proc)


# --- a second Docker engine, for stopping one mid-run --------------------------------------------


class SecondEngine:
    """A dockerd of our own (data, exec root, socket under `folder`); the machine's engine is never touched."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.socket = folder / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.log = folder / "dockerd.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        # Its own network namespace: a dockerd with --bridge none deletes the host's docker0
        # at start-up, which would break the machine's own engine for everyone else.
        args = ["unshare", "--net", "dockerd", "--data-root", self.folder / "data", "--exec-root", self.folder / "exec",
                "--pidfile", self.folder / "dockerd.pid", "-H", self.host, "--bridge", "none",
                "--iptables=false", "--ip-masq=false"]
        self.proc = start(args, self.log, dict(os.environ), cwd=self.folder)
        wait_for(self.answers, 60, "the second dockerd", proc=self.proc, log=self.log)

    def answers(self) -> bool:
        import docker

        try:
            client = docker.DockerClient(base_url=self.host, timeout=5)
            client.ping()
            client.close()
            return True
        except Exception:  # noqa: BLE001 - not up (yet)
            return False

    def client(self):
        import docker

        return docker.DockerClient(base_url=self.host, timeout=60)

    def stop(self) -> None:
        """Stop the engine as a service manager would (SIGTERM to dockerd) and wait until it is gone."""
        if self.proc is not None:
            stop(self.proc, grace_s=30)
            self.proc = None

    def load_from_machine_engine(self, *images: str) -> None:
        """Copy images from the machine's engine into this one (docker save | docker load)."""
        save = subprocess.Popen(["docker", "save", *images], stdout=subprocess.PIPE)
        loaded = subprocess.run(["docker", "-H", self.host, "load", "-q"], stdin=save.stdout,
                                capture_output=True, text=True)
        save.stdout.close()
        assert save.wait() == 0 and loaded.returncode == 0, loaded.stderr


# --- the Prefect REST API, read directly (minimal bodies: this server rejects explicit nulls) ------


def api_get(api_url: str, path: str):
    import httpx

    response = httpx.get(f"{api_url}/{path}", timeout=30)
    return response.json() if response.status_code == 200 else None


def api_filter(api_url: str, what: str, body: dict | None = None) -> list[dict]:
    import httpx

    response = httpx.post(f"{api_url}/{what}/filter", json={"limit": 200, **(body or {})}, timeout=30)
    response.raise_for_status()
    return response.json()


def final(run: dict) -> bool:
    return bool(run.get("state")) and run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def completed(run: dict) -> bool:
    return bool(run.get("state")) and run["state"]["type"] == "COMPLETED"

"""Connecting to a Docker engine (local socket, ssh://, unix://, tcp://) with bounded retries.

An engine that does not answer is an infrastructure fault, not a property of
the model: callers retry it a bounded number of times (`with_retries`), then
report it as such.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from tiergate.execution.dockersdk import docker
import requests

from tiergate.errors import InfrastructureFault
from tiergate.images import ENGINE_TIMEOUT_S

T = TypeVar("T")
DEFAULT_ATTEMPTS = 3
DEFAULT_BACKOFF_S = 0.5
API_TIMEOUT_S = ENGINE_TIMEOUT_S


def connect(docker_host: str = "local", *, use_ssh_client: bool = False) -> docker.DockerClient:
    """A client for `docker_host` ('local' means DOCKER_HOST or the local socket).

    ssh:// engines go through paramiko (the SDK's default): the user, port and
    IdentityFile come from the URL or ~/.ssh/config, and the host key must be in
    ~/.ssh/known_hosts. The remote user needs the `docker` CLI (dial-stdio).
    """
    try:
        if docker_host in ("", "local"):
            client = docker.from_env(timeout=API_TIMEOUT_S)
        else:
            client = docker.DockerClient(base_url=docker_host, timeout=API_TIMEOUT_S,
                                         use_ssh_client=use_ssh_client)
        client.ping()
        return client
    except Exception as exc:  # noqa: BLE001 - every way of not answering is the same fault
        raise InfrastructureFault(f"Docker engine {docker_host} does not answer: {_short(exc)}",
                                  hint="start it (scripts/setup) or check docker_host") from exc


def engine_problem(docker_host: str | None, *, use_ssh_client: bool = False) -> str | None:
    """Why the engine at `docker_host` does not answer, or None when it does (asked after a failure)."""
    try:
        connect(docker_host, use_ssh_client=use_ssh_client).close()
    except InfrastructureFault as exc:
        return exc.one_line()
    return None


def is_infrastructure(exc: BaseException) -> bool:
    """Faults of the engine or the link to it (worth a retry), as opposed to the run itself."""
    if isinstance(exc, InfrastructureFault):
        return True
    if isinstance(exc, (requests.exceptions.ConnectionError, ConnectionError, EOFError)):
        return True
    if isinstance(exc, docker.errors.APIError):
        return exc.status_code is not None and exc.status_code >= 500 and "No such" not in str(exc)
    try:
        import paramiko

        return isinstance(exc, paramiko.SSHException)
    except ImportError:  # pragma: no cover - paramiko is a dependency
        return False


def with_retries(action: Callable[[], T], *, attempts: int = DEFAULT_ATTEMPTS,
                 backoff_s: float = DEFAULT_BACKOFF_S, what: str = "engine call") -> T:
    """Run `action`, retrying infrastructure faults up to `attempts` times in all."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:  # noqa: BLE001 - classified just below
            if not is_infrastructure(exc):
                raise
            if attempt == attempts:
                raise InfrastructureFault(
                    f"{what}: engine unreachable after {attempts} attempts: {_short(exc)}") from exc
            time.sleep(backoff_s * 2 ** (attempt - 1))
    raise AssertionError("unreachable")  # pragma: no cover


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."

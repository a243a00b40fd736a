"""A target on a remote engine over ssh://, against a real OpenSSH server on 127.0.0.1.

The fixture starts Debian's sshd on a free 127.0.0.1 port with a throwaway host
key and a throwaway client key (authorized for root, who can reach the engine's
socket), points HOME at a folder holding ~/.ssh/config and known_hosts for the
client (paramiko, the Docker SDK's ssh transport, reads them from there), and
stops sshd by its PID afterwards.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import docker
import numpy as np
import pytest

import execution_kit as kit
from tiergate import results
from tiergate.execution import DockerBackend, backend_for, run_target
from tiergate.images import LABEL

pytestmark = [pytest.mark.docker, pytest.mark.ssh, pytest.mark.timeout(900)]
SSHD = "/usr/sbin/sshd"  # the `ssh` marker (tests/conftest.py) makes sure it is there, or fails the test


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sshd")
    port = _free_port()
    host_key = _keygen(folder / "host_ed25519")
    (folder / "authorized_keys").write_text(_keygen(folder / "id_ed25519") + "\n")
    config = folder / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {folder}/host_ed25519", f"PidFile {folder}/sshd.pid",
        f"AuthorizedKeysFile {folder}/authorized_keys", "PermitRootLogin prohibit-password", "AllowUsers root",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
        "StrictModes no", "UsePAM no", "LogLevel VERBOSE", ""]))
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
    log = open(folder / "sshd.log", "w")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    home = folder / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(f"Host 127.0.0.1\n  IdentityFile {folder}/id_ed25519\n")
    (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key}\n")
    try:
        _wait_for_port(port, proc, folder / "sshd.log")
        yield {"url": f"ssh://root@127.0.0.1:{port}", "home": home, "log": folder / "sshd.log"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_for_port(port: int, proc, log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {log.read_text()[-500:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"sshd did not listen on 127.0.0.1:{port}")


def test_target_runs_on_an_ssh_engine(sshd, images, models, data, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(sshd["home"]))
    dc = kit.device_class("x86_64-cpu-onnxruntime", execution="remote", docker_host=sshd["url"])
    image = images.get("x86_64-cpu-onnxruntime", models["mlp"])  # same engine behind the ssh link
    backend = backend_for(dc)
    assert isinstance(backend, DockerBackend) and backend.docker_host == sshd["url"]
    result = run_target(dc, image, data, tmp_path)
    assert result.ok, f"{result.reason}\n{result.log_tail}"
    assert result.machine == "x86_64" and len(result.latencies_ns) == 10
    np.testing.assert_allclose(results.load_outputs(tmp_path)["y"], kit.host_onnx(models["mlp"], data)["y"],
                               rtol=1e-5, atol=1e-5)
    assert "Accepted publickey for root" in sshd["log"].read_text()


def _containers_with(client, marker: str) -> list[str]:
    """Ids of the containers (running or not) whose environment holds `marker`."""
    found = []
    for container in client.containers.list(all=True, ignore_removed=True, filters={"label": f"{LABEL}.device_class"}):
        try:
            if marker in (container.attrs["Config"].get("Env") or []):
                found.append(container.id)
        except docker.errors.NotFound:  # removed between list and read
            pass
    return found


def test_ssh_timeout_still_kills_the_container(sshd, images, models, data, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(sshd["home"]))
    dc = kit.device_class("x86_64-cpu-onnxruntime", execution="remote", docker_host=sshd["url"], timeout_s=3)
    image = images.get("x86_64-cpu-onnxruntime", models["mlp"])
    token = uuid.uuid4().hex                 # tells this job's container from every other one on the engine
    marker = f"TIERGATE_TEST_JOB={token}"
    client = docker.from_env()
    seen: set[str] = set()
    done = threading.Event()

    def watch():
        while not done.is_set():
            seen.update(_containers_with(client, marker))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = run_target(dc, image, data, tmp_path, env={"TIERGATE_HARNESS_FAULT": "hang", "TIERGATE_TEST_JOB": token})
    finally:
        done.set()
        watcher.join(10)
    assert result.reason == "timed out after 3 s"
    assert result.wall_s < 60
    assert len(seen) == 1, f"expected to see the job's one container while it ran, saw {seen}"
    for container_id in seen:
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(container_id)
    assert _containers_with(client, marker) == []
    client.close()

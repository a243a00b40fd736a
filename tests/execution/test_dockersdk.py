"""tiergate.execution.dockersdk: the Docker SDK without paramiko until an ssh:// engine is used; then the SDK's own
ssh adapter (paramiko) is what an ssh:// client gets. In a fresh interpreter: this one may hold paramiko already."""

from __future__ import annotations

import subprocess
import sys

PROBE = r'''
import sys
import tiergate.execution.docker_backend, tiergate.execution.engine
print("paramiko at import:", "paramiko" in sys.modules)
from tiergate.execution.dockersdk import docker
try:
    docker.DockerClient(base_url="ssh://nobody@127.0.0.1:9", timeout=2)
    print("client made")
except docker.errors.DockerException as exc:
    print("sdk refused:", exc)
except Exception as exc:
    print("ssh tried:", type(exc).__module__.split(".")[0])
print("paramiko after:", "paramiko" in sys.modules)
print("adapter:", docker.api.client.SSHHTTPAdapter.__module__)
'''


def test_the_sdk_loads_paramiko_only_for_an_ssh_engine():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "paramiko at import: False"
    assert lines[1] in ("ssh tried: paramiko", "client made")      # the connection itself fails: no sshd on port 9
    assert lines[2] == "paramiko after: True"
    assert lines[3] == "adapter: docker.transport.sshconn"

"""The Docker SDK, imported without paramiko until an ssh:// engine is used.

docker 7.1's transport package imports its ssh adapter, and so paramiko (with invoke and cryptography's parts:
0.1-0.17 s of every gate's start, measured), whether or not any engine is reached over ssh://; its client names
the adapter only when a base URL starts with ssh://. Here the SDK is imported with paramiko refused (the SDK's own
`except ImportError` leaves the adapter out), and a stand-in is put where the client looks for the adapter: made
for an ssh:// engine, it imports the real adapter (and paramiko) and is that. Every tiergate module that imports
the SDK at its top imports it from here (`from tiergate.execution.dockersdk import docker`); an SDK imported
elsewhere first (with paramiko) is left as it is.
"""

from __future__ import annotations

import importlib.abc
import sys


class _NoParamiko(importlib.abc.MetaPathFinder):
    """Refuses paramiko while the SDK is imported."""

    def find_spec(self, name, path=None, target=None):
        if name == "paramiko" or name.startswith("paramiko."):
            raise ModuleNotFoundError(f"{name}: deferred until an ssh:// engine is used", name=name)
        return None


def _import():
    if "docker" in sys.modules:
        return sys.modules["docker"]
    blocker = _NoParamiko()
    sys.meta_path.insert(0, blocker)
    try:
        import docker
    finally:
        sys.meta_path.remove(blocker)
    import docker.api.client
    import docker.transport

    if not hasattr(docker.api.client, "SSHHTTPAdapter"):
        docker.api.client.SSHHTTPAdapter = docker.transport.SSHHTTPAdapter = SSHHTTPAdapter
    return docker


class SSHHTTPAdapter:
    """Stands for docker.transport.sshconn.SSHHTTPAdapter until an ssh:// client is made: made, it is the real one
    (imported then, with paramiko), which also takes its place in the SDK."""

    def __new__(cls, *args, **kwargs):
        import docker.api.client
        import docker.transport
        from docker.transport.sshconn import SSHHTTPAdapter as real

        docker.api.client.SSHHTTPAdapter = docker.transport.SSHHTTPAdapter = real
        return real(*args, **kwargs)


docker = _import()

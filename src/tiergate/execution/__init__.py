"""Execution backends behind one interface: `Backend.run(job) -> TargetResult`.

- `LocalProcessBackend`: the harness under the host's Python (host references, fast tests);
- `DockerBackend`: the harness in the device class's image on a local engine, an
  ssh:// engine, or with a GPU device request.

`run_target` runs one target and saves its result folder; `run_targets` runs many
in parallel threads. See docs/execution.md.
"""

from tiergate.execution.base import Backend, Job
from tiergate.execution.docker_backend import DockerBackend
from tiergate.execution.local import LocalProcessBackend
from tiergate.execution.run import backend_for, execute, run_target, run_targets

__all__ = ["Backend", "DockerBackend", "Job", "LocalProcessBackend", "backend_for", "execute",
           "run_target", "run_targets"]

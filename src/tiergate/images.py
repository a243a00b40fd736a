"""What the rest of tiergate knows about a built image, without importing Docker.

`tiergate.build` makes images (and needs Docker); execution, the orchestrator and
the fakes in the test suite only pass `BuiltImage` values around.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")   # goes into every runtime image (and its tag)
HOST_PIP_CONF = Path("/etc/pip.conf")                         # pip's index settings: likewise
DESCRIBER = "harness/tiergate_describe.py"                    # the runtime-graph describer, under containers/
DESCRIBE_FILE = "describe.json"                               # what it writes (in a describe folder or a run's)

# how long one call to a Docker engine waits for its answer: the docker SDK's clients (execution.engine) and the
# fast path's own socket (quickgate) alike; a busy engine is as slow for both, so neither gives up before the other
ENGINE_TIMEOUT_S = 120

LABEL = "org.tiergate"
COMPILE_KEY_LABEL = f"{LABEL}.compile.key"   # an artifact image built from a compile: its cache key


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    image_id: str
    labels: dict[str, str]
    reused: bool
    runtime_tag: str = ""
    runtime_reused: bool = False
    build_s: float = 0.0

    @property
    def model_path(self) -> str:
        """Where the artifact lies inside the image."""
        return self.labels[f"{LABEL}.model.path"]

    @property
    def versions(self) -> dict[str, str]:
        return json.loads(self.labels.get(f"{LABEL}.versions", "{}"))


def graph_cache_key(artifact_sha256: str, image_id: str, describer_sha256: str, cpu: str | None = None) -> str:
    """The describe cache's folder name of an artifact's runtime graph in a runtime image (execution.describe),
    on an emulated CPU model when the device class names one (its kernels may differ)."""
    image = image_id.split(":")[-1]
    return f"{artifact_sha256[:24]}-{image[:16]}-{describer_sha256[:8]}" + (f"-{cpu}" if cpu else "")

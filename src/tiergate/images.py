"""What the rest of tiergate knows about a built image, without importing Docker.

`tiergate.build` makes images (and needs Docker); execution, the orchestrator and
the fakes in the test suite only pass `BuiltImage` values around.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

LABEL = "org.tiergate"


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

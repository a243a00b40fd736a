"""The engine gc cleans (`DockerEngine`): its inventory in one disk-usage call, and removals where already gone is
fine."""

from __future__ import annotations

from tiergate import state
from tiergate.gc.common import ARTIFACT_LABEL, DEVICE_CLASS_LABEL, JOB_LABEL, RUNTIME_LABEL, epoch
from tiergate.gc.items import ContainerInfo, ImageInfo, Inventory, VolumeInfo


class DockerEngine:
    """The engine gc cleans: the local one (DOCKER_HOST or the socket), through tiergate.execution."""

    def __init__(self, client=None):
        if client is None:
            from tiergate.execution.engine import connect

            client = connect("local")
        self.client = client

    def inventory(self) -> Inventory:
        df = self._df()         # one call: images with their shared sizes, containers, volumes
        images = tuple(
            ImageInfo(i["Id"], tuple(t for t in (i.get("RepoTags") or []) if t != "<none>:<none>"),
                      dict(i.get("Labels") or {}), epoch(i.get("Created")), _own_size(i))
            for i in df.get("Images") or [] if RUNTIME_LABEL in (i.get("Labels") or {})
            or ARTIFACT_LABEL in (i.get("Labels") or {}))
        containers = tuple(
            ContainerInfo(c["Id"], (c.get("Names") or [""])[0].lstrip("/"), dict(c.get("Labels") or {}),
                          c.get("State", ""), epoch(c.get("Created")), c.get("ImageID", ""),
                          tuple(m["Name"] for m in c.get("Mounts") or [] if m.get("Type") == "volume" and m.get("Name")),
                          max(0, c.get("SizeRw") or 0))
            for c in df.get("Containers") or [] if JOB_LABEL in (c.get("Labels") or {})
            or DEVICE_CLASS_LABEL in (c.get("Labels") or {}))
        volumes = tuple(
            VolumeInfo(v["Name"], dict(v.get("Labels") or {}), state.parse_iso(v.get("CreatedAt")),
                       max(0, (v.get("UsageData") or {}).get("Size") or 0))
            for v in df.get("Volumes") or [] if JOB_LABEL in (v.get("Labels") or {}))
        return Inventory(images, containers, volumes)

    def _df(self, wait_s: float = 120.0) -> dict:
        """The engine's disk usage; the engine runs one at a time ("a disk usage operation is already running":
        another gc, or docker system df, on the shared engine): waited for, never a failure of this gc."""
        import time

        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self.client.df()
            except Exception as exc:  # docker.errors.APIError (409/500)
                if "already running" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def remove_image(self, ref: str) -> None:
        self._gone_is_fine(lambda: self.client.api.remove_image(ref, force=False, noprune=False))

    def remove_container(self, container_id: str) -> None:
        self._gone_is_fine(lambda: self.client.api.remove_container(container_id, v=False, force=False))

    def remove_volume(self, name: str) -> None:
        self._gone_is_fine(lambda: self.client.api.remove_volume(name, force=False))

    @staticmethod
    def _gone_is_fine(call) -> None:
        try:
            call()
        except Exception as exc:  # docker.errors.NotFound: already gone is what we wanted
            if getattr(exc, "status_code", None) != 404:
                raise


def _own_size(image: dict) -> int:
    size, shared = int(image.get("Size") or 0), int(image.get("SharedSize") or -1)
    return max(0, size - shared) if shared >= 0 else size

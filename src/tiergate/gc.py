"""`tiergate gc`: remove the images, run folders, cached decisions and compiled libraries nothing needs any more.

Planning and applying are separate. `plan()` reads TIERGATE_HOME (runs/, decisions/,
locks/), what the registry needs (`registry_needs`) and an inventory of the Docker
engine (`Inventory`, from `DockerEngine` or a fake in tests), and returns one `Item`
per thing it looked at, each with `remove` True or False and the reason. `apply()`
removes what the plan says, in a safe order (containers, volumes, decisions, runs,
images), and records each failure on its item.

What is kept, first rule that matches (docs/gc.md):
- what a promoted alias needs to be re-verified: the alias artifact and its FP32 reference
  (images, run folders, decisions), whatever the flags say;
- the last N registered artifacts of each model (--keep-last, default 3) and their references;
- for artifacts the registry does not know: the last N decisions of each candidate;
- everything a kept decision names (its run folders and images), and the image of a kept run;
- what a gate in progress holds (a locked `locks/<key>.lock`, a part file or folder (state.parse_part) of a live
  process), and while one runs, anything from the last hour;
- a compiled library (compiled/<key>/, a TVM class's compile cache) while an artifact image that stays was built
  from it (its compile-key label), or its artifact is kept; without the engine's inventory, every one;
- an MLflow download (mlflow/<key>/, tiergate.mlflow_bridge) while the registry keeps its artifact; any other is
  removed (a gate that names the version again downloads it again); the watcher's state (mlflow/watch-*.json) never;
- anything newer than --older-than;
- an image a running gate uses, in any home (its lease names it: tiergate.leases; the CLI holds the leases'
  gc lock while it plans and removes, so that no gate takes an image up meanwhile).
Images: only tiergate's artifact images that this home used (a run folder, a decision or a
registry run names them) are candidates (--all-images: every tiergate artifact image on the
engine); runtime images only with --runtime-images; base images (tiergate/base:*) never.
Leftover job containers and volumes (labels org.tiergate.job / org.tiergate.device_class)
are removed when not running and older than an hour.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from tiergate import state
from tiergate.errors import InputError
from tiergate.images import COMPILE_KEY_LABEL, LABEL
from tiergate.state import (RESULT_FILE, SHARDS_SUFFIX, Saved, flock_held,  # noqa: F401 - flock_held re-exported
                            parse_part, process_alive)

ARTIFACT_LABEL = f"{LABEL}.artifact.sha256"
DEVICE_CLASS_LABEL = f"{LABEL}.device_class"
RUNTIME_LABEL = f"{LABEL}.runtime"
RUNTIME_IMAGE_LABEL = f"{LABEL}.runtime_image"
JOB_LABEL = f"{LABEL}.job"
BASE_PREFIX = "tiergate/base:"
OWN_PREFIX = "tiergate/"
DEFAULT_KEEP_LAST = 3
GRACE = timedelta(hours=1)   # engine-shared leftovers and, while a gate runs, anything this recent
APPLY_ORDER = ("container", "volume", "decision", "run", "compiled", "mlflow", "image")
LEDGER = "gc-images.json"    # image ids of removed runs whose image could not be removed yet
_RUNNING = ("running", "restarting", "paused", "removing")


# --- what gc looks at --------------------------------------------------------------------


@dataclass(frozen=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    labels: dict[str, str]
    created: datetime | None
    size: int                  # bytes its removal frees (its own layers)


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    labels: dict[str, str]
    state: str                 # created, running, exited, dead, ...
    created: datetime | None
    image_id: str
    volumes: tuple[str, ...] = ()
    size: int = 0


@dataclass(frozen=True)
class VolumeInfo:
    name: str
    labels: dict[str, str]
    created: datetime | None
    size: int = 0


@dataclass(frozen=True)
class Inventory:
    images: tuple[ImageInfo, ...] = ()
    containers: tuple[ContainerInfo, ...] = ()
    volumes: tuple[VolumeInfo, ...] = ()


class Engine(Protocol):
    """The few engine calls gc makes (DockerEngine; a fake in the tests)."""

    def inventory(self) -> Inventory: ...
    def remove_image(self, ref: str) -> None: ...
    def remove_container(self, container_id: str) -> None: ...
    def remove_volume(self, name: str) -> None: ...


@dataclass
class Needs:
    """What the registry needs: artifact sha -> why; `protected` is what promoted aliases need."""

    keep: dict[str, str] = field(default_factory=dict)
    protected: set[str] = field(default_factory=set)
    models: dict[str, str] = field(default_factory=dict)       # registered sha -> model
    images: set[str] = field(default_factory=set)              # image ids the registry's runs name

    def add(self, sha: str | None, why: str, *, protected: bool = False) -> None:
        if not sha:
            return
        if protected and sha not in self.protected:
            self.protected.add(sha)
            self.keep[sha] = why
        else:
            self.keep.setdefault(sha, why)


def registry_needs(registry, keep_last: int = DEFAULT_KEEP_LAST) -> Needs:
    """Aliases (and their references) and the last `keep_last` artifacts of every model."""
    needs = Needs()
    for model in registry.models():
        artifacts = registry.artifacts(model)   # oldest first
        by_sha = {a.sha256: a for a in artifacts}
        needs.models.update({a.sha256: model for a in artifacts})
        for tier, sha in registry.aliases(model).items():
            needs.add(sha, f"promoted: {model}/{tier}", protected=True)
            record = by_sha.get(sha) or registry.find_artifact(sha)
            if record is not None:
                needs.add(record.reference_sha, f"FP32 reference of {model}/{tier}", protected=True)
        for record in artifacts[-keep_last:] if keep_last > 0 else []:
            needs.add(record.sha256, f"one of the last {keep_last} artifacts of {model}")
            needs.add(record.reference_sha, f"reference of a recent artifact of {model}")
    needs.images = {_image_key(r.image_id) for r in registry.runs() if r.image_id}
    return needs


# --- the plan ----------------------------------------------------------------------------


@dataclass
class Item:
    kind: str                  # image | run | decision | compiled | mlflow | container | volume
    id: str                    # image id, path, container id, volume name
    name: str                  # what a person reads: tag, folder name, file name
    size: int
    created: datetime | None
    remove: bool
    reason: str
    refs: tuple[str, ...] = ()          # image: the tags to remove it by
    artifact: str | None = None         # the artifact sha it belongs to, where known
    removed: bool = False
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.id, "name": self.name, "size_bytes": self.size,
                "size": human_size(self.size), "created": self.created.isoformat() if self.created else None,
                "action": "remove" if self.remove else "keep", "reason": self.reason,
                "artifact": self.artifact, "removed": self.removed, "error": self.error}


@dataclass
class Plan:
    items: list[Item]
    skipped: list[str] = field(default_factory=list)   # what could not be looked at, and why
    ledger: set[str] = field(default_factory=set)      # image ids still to remove later

    @property
    def removals(self) -> list[Item]:
        return [i for i in self.items if i.remove]

    @property
    def kept(self) -> list[Item]:
        return [i for i in self.items if not i.remove]

    @property
    def errors(self) -> list[Item]:
        return [i for i in self.items if i.error]


def plan(home: Path, needs: Needs, inventory: Inventory | None, *, keep_last: int = DEFAULT_KEEP_LAST,
         older_than: timedelta | None = None, runtime_images: bool = False, all_images: bool = False,
         now: datetime | None = None, lock_held: Callable[[Path], bool] | None = None,
         pid_alive: Callable[[int], bool] | None = None, leased: dict[str, str] | None = None) -> Plan:
    """What gc would remove and keep, and why (removes nothing). `leased`: image id or tag -> the running gate's
    lease naming it (tiergate.leases.leased()): kept, whatever else says."""
    if keep_last < 0:
        raise InputError(f"--keep-last {keep_last}: must be 0 or more")
    return _Planner(home, needs, keep_last, older_than, runtime_images, all_images,
                    now or datetime.now(timezone.utc), lock_held or flock_held, pid_alive or process_alive,
                    leased or {}).run(inventory)


class _Planner:
    def __init__(self, home: Path, needs: Needs, keep_last: int, older_than: timedelta | None,
                 runtime_images: bool, all_images: bool, now: datetime, lock_held, pid_alive, leased: dict[str, str]):
        self.home, self.needs, self.keep_last = home, needs, keep_last
        self.leased = {**leased, **{_image_key(ref): why for ref, why in leased.items() if ":" not in ref
                                    or ref.startswith("sha256:")}}
        self.older_than, self.runtime_images, self.all_images = older_than, runtime_images, all_images
        self.now, self.pid_alive = now, pid_alive
        self.cutoff = now - older_than if older_than else None
        self.held = {p.name[:-len(".lock")] for p in state.entries(home / state.LOCKS) if p.name.endswith(".lock")
                     and lock_held(p)}
        self.busy = bool(self.held)     # set again once live .part files are seen
        self.items: list[Item] = []
        self.keep_runs: dict[str, str] = {}      # run folder name -> why
        self.keep_images: dict[str, str] = {}    # image key -> why
        self.known_images: set[str] = set(needs.images) | _read_ledger(home)
        self.ledger: set[str] = set()
        self.staying_compiles: dict[str, str] = {}   # compile key -> the kept artifact image built from it

    def run(self, inventory: Inventory | None) -> Plan:
        decisions = state.saved_decisions(self.home)
        runs = state.saved_runs(self.home)
        compiles = state.saved_compiles(self.home)
        self.busy = self.busy or any(self._live_part(e.path.name) for e in [*decisions, *runs, *compiles])
        for doc, item in self._decisions(decisions):
            self.items.append(self._aged(item))
            if not item.remove:
                inputs = doc.inputs or {}
                for run in (inputs.get("runs") or {}).values():
                    self.keep_runs.setdefault(str(run).split(":", 1)[0], f"named by kept decision {doc.key[:12]}")
                for image in (inputs.get("images") or {}).values():
                    if image:
                        self.keep_images.setdefault(_image_key(image), f"named by kept decision {doc.key[:12]}")
        for decision in decisions:
            for image in ((decision.inputs or {}).get("images") or {}).values():
                if image:
                    self.known_images.add(_image_key(image))
        for run in runs:
            item = self._aged(self._run(run))
            self.items.append(item)
            if run.image_id:
                self.known_images.add(_image_key(run.image_id))
                if not item.remove:
                    self.keep_images.setdefault(_image_key(run.image_id), f"used by kept run {run.path.name}")
        # Images stay "known" to this home after the runs naming them are gone (gc-images.json),
        # so an image whose removal failed or was skipped (engine down) is removed by a later gc.
        self.ledger = set(self.known_images)
        if inventory is not None:
            self._engine(inventory)
        for compiled in compiles:
            self.items.append(self._aged(self._compiled(compiled, inventory is not None)))
        for download in state.saved_mlflow(self.home):
            self.items.append(self._aged(self._mlflow(download)))
        self._check_protected()
        return Plan(self.items, [], self.ledger)

    # -- decisions ---------------------------------------------------------------------
    def _decisions(self, decisions: list[Saved]) -> Iterable[tuple[Saved, Item]]:
        unregistered: dict[str, list[Saved]] = {}
        for d in decisions:
            candidate = (d.inputs or {}).get("candidate")
            if d.inputs is not None and candidate and candidate not in self.needs.models:
                unregistered.setdefault(candidate, []).append(d)
        recent: set[str] = set()
        for group in unregistered.values():
            group.sort(key=lambda d: d.created or datetime.min.replace(tzinfo=timezone.utc), reverse=True)
            recent.update(str(d.path) for d in group[:self.keep_last])
        for d in decisions:
            candidate = (d.inputs or {}).get("candidate")
            item = Item("decision", str(d.path), d.path.name, d.size, d.created, True, "", artifact=candidate)
            if parse_part(d.path.name) is not None:
                live = self._live_part(d.path.name)
                item.remove, item.reason = (False, "being written by a gate in progress") if live else \
                    (True, "partial write of a gate that is no longer running")
            elif d.path.suffix == ".pickle":
                item.reason = "pickle decision cache of an older tiergate (decisions are JSON now)"
            elif d.inputs is None:
                item.reason = "not a readable decision file"
            elif d.key in self.held:
                item.remove, item.reason = False, "pending: a gate holds its lock"
            elif candidate in self.needs.keep:
                item.remove, item.reason = False, f"candidate {_short(candidate)}: {self.needs.keep[candidate]}"
            elif str(d.path) in recent:
                item.remove, item.reason = False, \
                    f"one of the last {self.keep_last} decisions of unregistered candidate {_short(candidate)}"
            elif candidate in self.needs.models:
                item.reason = (f"candidate {_short(candidate)} of model {self.needs.models[candidate]} is not "
                               f"promoted{self._recent()}")
            else:
                item.reason = (f"unregistered candidate {_short(candidate)}: "
                               + (f"older than its last {self.keep_last} decisions" if self.keep_last
                                  else "--keep-last 0"))
            yield d, item

    # -- run folders -------------------------------------------------------------------
    def _run(self, run: Saved) -> Item:
        name = run.path.name
        item = Item("run", str(run.path), name, run.size, run.created, True, "", artifact=run.artifact)
        if parse_part(name) is not None:
            live = self._live_part(name)
            item.remove, item.reason = (False, "being written by a gate in progress") if live else \
                (True, "partial run of a gate that is no longer running")
        elif name in self.held or name.removesuffix(SHARDS_SUFFIX) in self.held:
            item.remove, item.reason = False, "pending: a gate holds its lock"
        elif name.endswith(SHARDS_SUFFIX):
            item.reason = "finished shards of a run that did not finish (its re-run would reuse them)"
        elif run.artifact is None:
            item.reason = f"no readable {RESULT_FILE}"
        elif run.artifact in self.needs.keep:
            item.remove, item.reason = False, f"artifact {_short(run.artifact)}: {self.needs.keep[run.artifact]}"
        elif name in self.keep_runs:
            item.remove, item.reason = False, self.keep_runs[name]
        elif run.artifact in self.needs.models:
            item.reason = (f"artifact {_short(run.artifact)} of model {self.needs.models[run.artifact]} is not "
                           f"promoted{self._recent()}")
        else:
            item.reason = f"unregistered artifact {_short(run.artifact)}: no kept decision names this run"
        return item

    # -- the compile cache -------------------------------------------------------------
    def _compiled(self, compiled: Saved, engine_known: bool) -> Item:
        name = compiled.path.name
        item = Item("compiled", str(compiled.path), name, compiled.size, compiled.created, True, "",
                    artifact=compiled.artifact)
        if parse_part(name) is not None:
            live = self._live_part(name)
            item.remove, item.reason = (False, "being written by a compile in progress") if live else \
                (True, "partial compile of a gate that is no longer running")
        elif f"compile-{name}" in self.held:
            item.remove, item.reason = False, "pending: a gate holds its lock"
        elif compiled.artifact in self.needs.keep:
            item.remove, item.reason = False, f"artifact {_short(compiled.artifact)}: {self.needs.keep[compiled.artifact]}"
        elif name in self.staying_compiles:
            item.remove, item.reason = False, f"kept image {self.staying_compiles[name]} was built from it"
        elif not engine_known:
            item.remove, item.reason = False, "the engine's images were not looked at: one may be built from it"
        else:
            item.reason = "compiled library no kept image was built from (a gate that needs it compiles it again)"
        return item

    # -- the MLflow download cache -----------------------------------------------------
    def _mlflow(self, download: Saved) -> Item:
        name = download.path.name
        item = Item("mlflow", str(download.path), name, download.size, download.created, True,
                    "a model version downloaded from MLflow (fetched again when a gate names it)",
                    artifact=download.artifact)
        if parse_part(name) is not None:
            live = self._live_part(name)
            item.remove, item.reason = (False, "being downloaded by a gate in progress") if live else \
                (True, "partial download of a gate that is no longer running")
        elif download.artifact in self.needs.keep:
            item.remove = False
            item.reason = f"artifact {_short(download.artifact)}: {self.needs.keep[download.artifact]}"
        return item

    # -- the engine --------------------------------------------------------------------
    def _engine(self, inventory: Inventory) -> None:
        leftover_cutoff = self.now - max(GRACE, self.older_than or timedelta(0))
        kept_containers = []
        for c in inventory.containers:
            if not (JOB_LABEL in c.labels or DEVICE_CLASS_LABEL in c.labels):
                continue
            item = Item("container", c.id, c.name or c.id[:12], c.size, c.created, True,
                        f"{c.state} container of a gate that is no longer running",
                        artifact=c.labels.get(ARTIFACT_LABEL))
            if c.state in _RUNNING:
                item.remove, item.reason = False, f"{c.state}"
            elif c.created is not None and c.created > leftover_cutoff:
                item.remove, item.reason = False, f"created less than {_span(self.now - leftover_cutoff)} ago"
            self.items.append(item)
            if not item.remove:
                kept_containers.append(c)
        used_volumes = {v: c for c in kept_containers for v in c.volumes}
        for v in inventory.volumes:
            if JOB_LABEL not in v.labels:
                continue
            item = Item("volume", v.name, v.name, v.size, v.created, True, "job volume of a gate that is no longer running")
            if v.name in used_volumes:
                item.remove, item.reason = False, f"used by container {used_volumes[v.name].name or used_volumes[v.name].id[:12]}"
            elif v.created is not None and v.created > leftover_cutoff:
                item.remove, item.reason = False, f"created less than {_span(self.now - leftover_cutoff)} ago"
            self.items.append(item)
        for c in kept_containers:
            self.keep_images.setdefault(_image_key(c.image_id), f"used by container {c.name or c.id[:12]}")
        images = [i for i in inventory.images if not any(t.startswith(BASE_PREFIX) for t in i.tags)]
        artifact_images = [i for i in images if ARTIFACT_LABEL in i.labels]
        runtime = [i for i in images if ARTIFACT_LABEL not in i.labels and RUNTIME_LABEL in i.labels]
        staying_runtime_tags: set[str] = set()
        for image in artifact_images:
            item = self._aged(self._artifact_image(image))
            self.items.append(item)
            if not item.remove:
                staying_runtime_tags.add(image.labels.get(RUNTIME_IMAGE_LABEL, ""))
                if image.labels.get(COMPILE_KEY_LABEL):
                    self.staying_compiles[image.labels[COMPILE_KEY_LABEL]] = ", ".join(image.tags) or image.id[:19]
        for image in runtime:
            self.items.append(self._runtime_image(image, staying_runtime_tags, leftover_cutoff))
        present = {_image_key(i.id) for i in inventory.images}
        self.ledger = {k for k in self.known_images if k in present}

    def _artifact_image(self, image: ImageInfo) -> Item:
        sha = image.labels.get(ARTIFACT_LABEL, "")
        key = _image_key(image.id)
        item = Item("image", image.id, ", ".join(image.tags) or image.id[:19], image.size, image.created, True, "",
                    refs=image.tags, artifact=sha)
        foreign = [t for t in image.tags if not t.startswith(OWN_PREFIX)]
        lease = self._lease(image)
        if lease:
            item.remove, item.reason = False, lease
        elif foreign:
            item.remove, item.reason = False, f"also tagged {foreign[0]} (not a tiergate tag)"
        elif sha in self.needs.keep:
            item.remove, item.reason = False, f"artifact {_short(sha)}: {self.needs.keep[sha]}"
        elif key in self.keep_images:
            item.remove, item.reason = False, self.keep_images[key]
        elif not self.all_images and key not in self.known_images:
            item.remove, item.reason = False, "no run of this TIERGATE_HOME used it (--all-images to include)"
        elif sha in self.needs.models:
            item.reason = (f"artifact {_short(sha)} of model {self.needs.models[sha]} is not "
                           f"promoted{self._recent()}")
        else:
            item.reason = f"unregistered artifact {_short(sha)}: no kept run or decision uses this image"
        return item

    def _runtime_image(self, image: ImageInfo, staying: set[str], leftover_cutoff: datetime) -> Item:
        item = Item("image", image.id, ", ".join(image.tags) or image.id[:19], image.size, image.created, True,
                    "runtime image no remaining artifact image is built on", refs=image.tags)
        foreign = [t for t in image.tags if not t.startswith(OWN_PREFIX)]
        lease = self._lease(image)
        if not self.runtime_images:
            item.remove, item.reason = False, "runtime image (--runtime-images to include)"
        elif lease:
            item.remove, item.reason = False, lease
        elif foreign:
            item.remove, item.reason = False, f"also tagged {foreign[0]} (not a tiergate tag)"
        elif staying & set(image.tags):
            item.remove, item.reason = False, "base of a kept artifact image"
        elif _image_key(image.id) in self.keep_images:
            item.remove, item.reason = False, self.keep_images[_image_key(image.id)]
        elif image.created is not None and image.created > leftover_cutoff:
            item.remove, item.reason = False, f"created less than {_span(self.now - leftover_cutoff)} ago"
        return item

    def _lease(self, image: ImageInfo) -> str:
        """Why a running gate (in any home) needs the image, or '' (its lease names its id or a tag)."""
        for ref in (image.id, _image_key(image.id), *image.tags):
            if ref in self.leased:
                return f"in use by a running gate (lease {self.leased[ref]})"
        return ""

    def _recent(self) -> str:
        return f" nor among its last {self.keep_last} artifacts" if self.keep_last else " (--keep-last 0)"

    # -- age and safety ----------------------------------------------------------------
    def _aged(self, item: Item) -> Item:
        """A removal of something too recent becomes a keep (--older-than; a gate in progress)."""
        if not item.remove or item.created is None:
            return item
        if self.cutoff is not None and item.created > self.cutoff:
            item.remove, item.reason = False, f"newer than {_span(self.older_than)} (--older-than)"
        elif self.busy and item.created > self.now - GRACE:
            item.remove, item.reason = False, "a gate is in progress and this is from the last hour"
        return item

    def _live_part(self, name: str) -> bool:
        part = parse_part(name)
        if part is None:
            return False
        return part[0] in self.held or self.pid_alive(part[1])

    def _check_protected(self) -> None:
        for item in self.items:
            if item.remove and item.artifact in self.needs.protected and parse_part(item.name) is None:
                raise AssertionError(f"gc planned to remove {item.kind} {item.name}, which a promoted alias needs")


# --- applying ----------------------------------------------------------------------------


def apply(plan: Plan, home: Path, engine: Engine | None) -> Plan:
    """Remove what the plan removes; each failure is recorded on its item, never raised."""
    order = {kind: n for n, kind in enumerate(APPLY_ORDER)}
    for item in sorted(plan.removals, key=lambda i: order[i.kind]):
        try:
            if item.kind in ("run", "decision", "compiled", "mlflow"):
                _remove_file(Path(item.id), home, item)
            elif engine is None:
                continue
            elif item.kind == "container":
                engine.remove_container(item.id)
            elif item.kind == "volume":
                engine.remove_volume(item.name)
            elif item.kind == "image":
                for ref in item.refs or (item.id,):
                    engine.remove_image(ref)
            item.removed = item.error is None
        except Exception as exc:  # noqa: BLE001 - one failure never stops the rest
            item.error = " ".join(str(exc).split())[:300] or type(exc).__name__
    removed = {_image_key(i.id) for i in plan.items if i.kind == "image" and i.removed}
    _write_ledger(home, plan.ledger - removed)
    return plan


def _remove_file(path: Path, home: Path, item: Item) -> None:
    root = home.resolve()
    if root not in path.resolve().parents:
        raise AssertionError(f"{path} is not under {root}")
    if item.kind == "run":
        item.error = state.remove_run(path, home)
    elif item.kind == "compiled":
        item.error = state.remove_compiled(path, home)
    elif path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


# --- the Docker engine ---------------------------------------------------------------------


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
                      dict(i.get("Labels") or {}), _epoch(i.get("Created")), _own_size(i))
            for i in df.get("Images") or [] if RUNTIME_LABEL in (i.get("Labels") or {})
            or ARTIFACT_LABEL in (i.get("Labels") or {}))
        containers = tuple(
            ContainerInfo(c["Id"], (c.get("Names") or [""])[0].lstrip("/"), dict(c.get("Labels") or {}),
                          c.get("State", ""), _epoch(c.get("Created")), c.get("ImageID", ""),
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


# --- the ledger -------------------------------------------------------------------------------


def _read_ledger(home: Path) -> set[str]:
    try:
        return set(json.loads((home / LEDGER).read_text()).get("images", []))
    except (OSError, ValueError, AttributeError):
        return set()


def _write_ledger(home: Path, images: set[str]) -> None:
    path = home / LEDGER
    if not images:
        path.unlink(missing_ok=True)
        return
    state.write_json(path, {"images": sorted(images)})


# --- small helpers -------------------------------------------------------------------------


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """'30d', '12h', '90m', '2w', '45s' (or '0')."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text or "")
    if not match or (not match[2] and float(match[1]) != 0):
        raise InputError(f"--older-than {text!r} is not a duration such as 30d, 12h, 90m, 2w")
    try:
        age = timedelta(seconds=float(match[1]) * _UNITS.get(match[2] or "s", 1))
        datetime.now(timezone.utc) - age        # an age reaching before year 1 cannot be compared either
    except (OverflowError, ValueError):
        raise InputError(f"--older-than {text!r} is too long (at most {_MAX_DAYS} days)") from None
    return age


_MAX_DAYS = (datetime.now(timezone.utc) - datetime.min.replace(tzinfo=timezone.utc)).days - 1


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _span(delta: timedelta | None) -> str:
    seconds = int((delta or timedelta(0)).total_seconds())
    for unit, width in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= width and seconds % width == 0:
            return f"{seconds // width}{unit}"
    return f"{seconds}s"


def _short(sha: str | None) -> str:
    return (sha or "?")[:12]


def _image_key(image_id: str) -> str:
    """Image ids with or without 'sha256:', and short ones, compare equal by their first 12 hex digits."""
    return image_id.split(":", 1)[-1][:12] if image_id else ""


def _epoch(value) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(value), timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return None

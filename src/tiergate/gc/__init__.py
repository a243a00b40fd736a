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

Modules (this package re-exports their public names: `gc.plan`, `gc.apply`, `gc.DockerEngine`, ...):
- items.py: what gc looks at (`Inventory`, `registry_needs`) and plans (`Item`, `Plan`);
- planner.py: `Planner`, a run's settings and books and the judgements every kind shares (lease, age, live writer);
- home_items.py / engine_items.py: each kind judged: decisions, runs, compiled libraries, MLflow downloads / job
  containers and volumes, artifact and runtime images;
- planning.py: `plan()`, the kinds in order; removing.py: `apply()`; docker_engine.py: `DockerEngine`;
- common.py: the labels, the ledger, durations and sizes, image keys.
"""

from __future__ import annotations

from tiergate.gc.common import (APPLY_ORDER, ARTIFACT_LABEL, BASE_PREFIX, DEFAULT_KEEP_LAST, DEVICE_CLASS_LABEL, GRACE,
                                JOB_LABEL, LEDGER, OWN_PREFIX, RUNNING, RUNTIME_IMAGE_LABEL, RUNTIME_LABEL, epoch,
                                human_size, image_key, parse_duration, read_ledger, short, span, write_ledger)
from tiergate.gc.docker_engine import DockerEngine
from tiergate.gc.items import (ContainerInfo, Engine, ImageInfo, Inventory, Item, Needs, Plan, VolumeInfo,
                               registry_needs)
from tiergate.gc.planner import Planner
from tiergate.gc.planning import plan
from tiergate.gc.removing import apply
from tiergate.state import flock_held  # noqa: F401 - re-exported, as before the split

__all__ = [
    "APPLY_ORDER", "ARTIFACT_LABEL", "BASE_PREFIX", "DEFAULT_KEEP_LAST", "DEVICE_CLASS_LABEL", "GRACE", "JOB_LABEL",
    "LEDGER", "OWN_PREFIX", "RUNNING", "RUNTIME_IMAGE_LABEL", "RUNTIME_LABEL", "ContainerInfo", "DockerEngine", "Engine",
    "ImageInfo", "Inventory", "Item", "Needs", "Plan", "Planner", "VolumeInfo", "apply", "epoch", "human_size",
    "image_key", "parse_duration", "plan", "read_ledger", "registry_needs", "short", "span", "write_ledger",
]

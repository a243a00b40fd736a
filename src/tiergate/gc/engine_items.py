"""What gc keeps and removes on the engine: leftover job containers and volumes, artifact images and (with
--runtime-images) runtime images, one `Item` each with its reason (docs/gc.md)."""

from __future__ import annotations

from datetime import datetime, timedelta

from tiergate.gc.common import (ARTIFACT_LABEL, BASE_PREFIX, DEVICE_CLASS_LABEL, GRACE, JOB_LABEL, OWN_PREFIX,
                                RUNNING, RUNTIME_IMAGE_LABEL, RUNTIME_LABEL, image_key, short, span)
from tiergate.gc.items import ImageInfo, Inventory, Item
from tiergate.gc.planner import Planner
from tiergate.images import COMPILE_KEY_LABEL


def engine_items(p: Planner, inventory: Inventory) -> None:
    leftover_cutoff = p.now - max(GRACE, p.older_than or timedelta(0))
    kept_containers = []
    for c in inventory.containers:
        if not (JOB_LABEL in c.labels or DEVICE_CLASS_LABEL in c.labels):
            continue
        item = Item("container", c.id, c.name or c.id[:12], c.size, c.created, True,
                    f"{c.state} container of a gate that is no longer running",
                    artifact=c.labels.get(ARTIFACT_LABEL))
        if c.state in RUNNING:
            item.remove, item.reason = False, f"{c.state}"
        elif c.created is not None and c.created > leftover_cutoff:
            item.remove, item.reason = False, f"created less than {span(p.now - leftover_cutoff)} ago"
        p.items.append(item)
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
            item.remove, item.reason = False, f"created less than {span(p.now - leftover_cutoff)} ago"
        p.items.append(item)
    for c in kept_containers:
        p.keep_images.setdefault(image_key(c.image_id), f"used by container {c.name or c.id[:12]}")
    images = [i for i in inventory.images if not any(t.startswith(BASE_PREFIX) for t in i.tags)]
    artifact_images = [i for i in images if ARTIFACT_LABEL in i.labels]
    runtime = [i for i in images if ARTIFACT_LABEL not in i.labels and RUNTIME_LABEL in i.labels]
    staying_runtime_tags: set[str] = set()
    for image in artifact_images:
        item = p.aged(artifact_image_item(p, image))
        p.items.append(item)
        if not item.remove:
            staying_runtime_tags.add(image.labels.get(RUNTIME_IMAGE_LABEL, ""))
            if image.labels.get(COMPILE_KEY_LABEL):
                p.staying_compiles[image.labels[COMPILE_KEY_LABEL]] = ", ".join(image.tags) or image.id[:19]
    for image in runtime:
        p.items.append(runtime_image_item(p, image, staying_runtime_tags, leftover_cutoff))
    present = {image_key(i.id) for i in inventory.images}
    p.ledger = {k for k in p.known_images if k in present}


def artifact_image_item(p: Planner, image: ImageInfo) -> Item:
    sha = image.labels.get(ARTIFACT_LABEL, "")
    key = image_key(image.id)
    item = Item("image", image.id, ", ".join(image.tags) or image.id[:19], image.size, image.created, True, "",
                refs=image.tags, artifact=sha)
    foreign = [t for t in image.tags if not t.startswith(OWN_PREFIX)]
    lease = p.lease(image)
    if lease:
        item.remove, item.reason = False, lease
    elif foreign:
        item.remove, item.reason = False, f"also tagged {foreign[0]} (not a tiergate tag)"
    elif sha in p.needs.keep:
        item.remove, item.reason = False, f"artifact {short(sha)}: {p.needs.keep[sha]}"
    elif key in p.keep_images:
        item.remove, item.reason = False, p.keep_images[key]
    elif not p.all_images and key not in p.known_images:
        item.remove, item.reason = False, "no run of this TIERGATE_HOME used it (--all-images to include)"
    elif sha in p.needs.models:
        item.reason = (f"artifact {short(sha)} of model {p.needs.models[sha]} is not "
                       f"promoted{p.recent()}")
    else:
        item.reason = f"unregistered artifact {short(sha)}: no kept run or decision uses this image"
    return item


def runtime_image_item(p: Planner, image: ImageInfo, staying: set[str], leftover_cutoff: datetime) -> Item:
    item = Item("image", image.id, ", ".join(image.tags) or image.id[:19], image.size, image.created, True,
                "runtime image no remaining artifact image is built on", refs=image.tags)
    foreign = [t for t in image.tags if not t.startswith(OWN_PREFIX)]
    lease = p.lease(image)
    if not p.runtime_images:
        item.remove, item.reason = False, "runtime image (--runtime-images to include)"
    elif lease:
        item.remove, item.reason = False, lease
    elif foreign:
        item.remove, item.reason = False, f"also tagged {foreign[0]} (not a tiergate tag)"
    elif staying & set(image.tags):
        item.remove, item.reason = False, "base of a kept artifact image"
    elif image_key(image.id) in p.keep_images:
        item.remove, item.reason = False, p.keep_images[image_key(image.id)]
    elif image.created is not None and image.created > leftover_cutoff:
        item.remove, item.reason = False, f"created less than {span(p.now - leftover_cutoff)} ago"
    return item

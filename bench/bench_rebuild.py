"""Rebuilding an image when only the artifact changed versus the first build, side by side.

    .venv/bin/python bench/bench_rebuild.py [--device-class x86_64-cpu-onnxruntime] [--repeat 3]

The first build is made cold: a fresh base image (the device class's base plus a
unique label, so no Docker layer cache applies), an empty wheel cache
(TIERGATE_CACHE_DIR in a temporary folder: the wheels are downloaded again), no
runtime image. Then only the artifact changes (new weights) and the image is
built again, `--repeat` times. Prints both times and their ratio. The target:
rebuild <= 10% of the first build. Removes the images it made.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import docker

from bench_harness import cnn_model, sha256
from tiergate.build import build_image
from tiergate.targets import resolve


def fresh_base(client, base: str) -> str:
    tag = f"tiergate/bench-base:{uuid.uuid4().hex[:12]}"
    dockerfile = f"FROM {base}\nLABEL org.tiergate.bench={uuid.uuid4().hex}\n"
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, network_mode="none")
    return tag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-class", default="x86_64-cpu-onnxruntime")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    dc = resolve([args.device_class])[0]
    client = docker.from_env()
    made = []
    with tempfile.TemporaryDirectory(prefix="tiergate-bench-") as tmp:
        work = Path(tmp)
        os.environ["TIERGATE_CACHE_DIR"] = str(work / "cache")
        base = fresh_base(client, dc.base_image)
        made.append(base)
        try:
            first_model = cnn_model(work / "v0.onnx", seed=0)
            t0 = time.monotonic()
            first = build_image(dc, first_model, artifact_sha256=sha256(first_model), base_image=base)
            first_s = time.monotonic() - t0
            made += [first.tag, first.runtime_tag]
            assert not first.reused and not first.runtime_reused
            rebuilds = []
            for i in range(1, args.repeat + 1):
                model = cnn_model(work / f"v{i}.onnx", seed=i)
                t0 = time.monotonic()
                image = build_image(dc, model, artifact_sha256=sha256(model), base_image=base)
                rebuilds.append(time.monotonic() - t0)
                made.append(image.tag)
                assert image.runtime_reused and not image.reused and image.runtime_tag == first.runtime_tag
            t0 = time.monotonic()
            again = build_image(dc, model, artifact_sha256=sha256(model), base_image=base)
            reuse_s = time.monotonic() - t0
            assert again.reused
        finally:
            for tag in reversed(made):
                try:
                    client.images.remove(tag, force=True)
                except docker.errors.DockerException:
                    pass
    rebuild = statistics.median(rebuilds)
    print(f"device class {dc.name} ({dc.arch}, {dc.execution}), base {dc.base_image}")
    print(f"{'first build (cold)':<28} {first_s:8.2f} s")
    print(f"{'rebuild, new artifact':<28} {rebuild:8.2f} s   (median of {len(rebuilds)}: "
          + ", ".join(f"{x:.2f}" for x in rebuilds) + ")")
    print(f"{'unchanged inputs (reuse)':<28} {reuse_s:8.2f} s")
    ratio = rebuild / first_s
    print(f"rebuild / first build = {ratio:.3f}   target <= 0.10: {'met' if ratio <= 0.10 else 'NOT met'}")


if __name__ == "__main__":
    main()

"""The build step's compile stage, for device classes whose runtime compiles the artifact (tvm; docs/tvm.md).

- the compiler image: containers/tvm/compiler.Dockerfile on the amd64 base, with the TVM version of the class
  (containers/tvm/requirements.txt rendered with its runtime_version, wheels installed on the host as for runtime
  images), gcc and the aarch64 cross linker; tagged by a content hash of everything in it and reused, built on
  demand (`ensure_compiler_image`);
- the compile: containers/tvm/tiergate_tvm_compile.py in a container of that image (no network), the model copied
  in, `model.so` and `tvm-meta.json` (the passes applied, with the structural hash of the module after each) read
  back (`compiled`). Static input shapes come from the evaluation data (`static_shapes`: the sample axis at the
  class's batch_size), else from the model itself;
- the compile cache: `state.compiled_folder(compile_key(...))`, keyed by the artifact's sha256, the compiler image
  (TVM version and lock, recipe, script, base), the target, the opt level, the passes switched off and the static
  shapes; written whole or not at all and sealed (state.publish_folder).

A model TVM cannot make static, import or compile raises InputError with TVM's reason (that tier's build fails:
a failed run, never a crash); a compiler image that cannot be built is an EnvironmentProblem (exit 2).

The same stage compiles for an ethos-u class with Arm's Vela (docs/npu.md): a `Toolchain` says what differs (the
image's recipe and lock, the compile's command and files, the key's class part, the image's files and labels, the
describe document); TVM's is here, Vela's parts are tiergate.build.vela's. The image, the container, the cache, its lock
and the refusal record are one path for both.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from tiergate.execution.dockersdk import docker
import requests

from tiergate import state
from tiergate.build.engine import (base_python_version, building, content_digest, docker_build, ensure_base_image,
                                   normalise_modes, one_line)
from tiergate.build.runtime import ca_bundle_bytes, download_wheels, install_on_host
from tiergate.build.toolchain import COMPILER_BASE, ERROR, KEY_LABEL, META, Compiled, CompilerImage, Toolchain
from tiergate.build.tvm import TVM
from tiergate.build.vela import VELA
from tiergate.errors import EnvironmentProblem, InputError
from tiergate.hashing import file_sha256
from tiergate.images import LABEL
from tiergate.paths import containers_dir
from tiergate.targets import DeviceClass


def compile_key(dc: DeviceClass, artifact_sha256: str, shapes: dict, compiler_tag: str) -> str:
    """The compile cache's key: everything that can change the library (docs/tvm.md, docs/npu.md)."""
    return content_digest([compiler_tag, artifact_sha256, *toolchain(dc).key_parts(dc),
                    json.dumps(shapes, sort_keys=True)])[:32]


def compile_shapes(dc: DeviceClass, artifact, input_shapes: dict | None = None) -> dict[str, list[int]]:
    """The static shapes a class's compiler takes ({} for Vela, which sets a dynamic batch axis to 1 itself)."""
    return toolchain(dc).shapes(dc, artifact, input_shapes)


def toolchain(dc: DeviceClass) -> Toolchain:
    """The compiler of a class that compiles its artifact; InputError for another class."""
    if dc.runtime == "ethos-u":
        return VELA
    if dc.runtime == "tvm":
        return TVM
    raise InputError(f"{dc.name}: runtime {dc.runtime} does not compile its artifact")


def compiler_base(dc: DeviceClass) -> str:
    """The compiler image's base: an amd64 class's own, else the offline amd64 base (scripts/setup)."""
    return (dc.base_image or COMPILER_BASE) if dc.arch == "amd64" else COMPILER_BASE


def ensure_compiler_image(dc: DeviceClass, *, client, ca_bundle: Path | None = None) -> CompilerImage:
    """The compiler image for the class's compiler version, built once (content-hash tag, like runtime images)."""
    tool = toolchain(dc)
    recipe, script, lock_file = (containers_dir() / p for p in (tool.recipe, tool.script, tool.lock))
    for path in (recipe, script, lock_file):
        if not path.is_file():
            raise EnvironmentProblem(f"{dc.name}: the {tool.name} compiler's {path} is missing")
    base = compiler_base(dc)
    # what build's base-image and wheel helpers read of a class, for the compiler's own platform
    name = tool.repository.rsplit("/", 1)[-1]
    amd64 = SimpleNamespace(runtime=name, machine="x86_64", arch="amd64", name=dc.name, platform="linux/amd64")
    base_id = ensure_base_image(client, base, amd64)
    python = base_python_version(client, base, base_id)
    lock = lock_file.read_text().replace("{runtime_version}", dc.runtime_version)
    digest = content_digest([file_sha256(recipe), file_sha256(script), lock, base, base_id, python])
    tag = f"{tool.repository}:{digest[:20]}"
    labels = {f"{LABEL}.compiler": tool.name.lower(),
              f"{LABEL}.compiler.lock": hashlib.sha256(lock.encode()).hexdigest(),
              f"{LABEL}.base_image": base, f"{LABEL}.runtime.version": dc.runtime_version}
    with building(client, tag, labels) as found:
        if found is not None:
            return CompilerImage(tag, found.id, True)
        image = _build_compiler(client, tag, labels, recipe, script, lock, amd64, python, base, ca_bundle, tool)
    return CompilerImage(tag, image.id, False)


def _build_compiler(client, tag, labels, recipe, script, lock, amd64, python, base, ca_bundle, tool):
    with tempfile.TemporaryDirectory(prefix=f"tiergate-{tool.name.lower()}-compiler-") as tmp:
        ctx = Path(tmp)
        shutil.copyfile(recipe, ctx / "Dockerfile")
        shutil.copyfile(script, ctx / Path(tool.script).name)
        cert = None
        if ca_bundle is not None:
            cert = ctx / "ca-bundle.crt"
            cert.write_bytes(ca_bundle_bytes(ca_bundle))
        wheels = download_wheels(lock, amd64, python, cert)
        install_on_host(lock, wheels, amd64, python, ctx / "site-packages")
        if cert is not None:
            cert.unlink()
        normalise_modes(ctx)
        return docker_build(client, ctx, tag, {"BASE_IMAGE": base}, labels,
                             network="host" if tool.apt else "none")      # TVM's recipe runs apt-get


def compiled(dc: DeviceClass, artifact, *, input_shapes: dict | None = None, client=None,
             ca_bundle: Path | None = None) -> Compiled:
    """`artifact` (a loaded Artifact) compiled for `dc`, from the compile cache or made now (InputError when its
    compiler, TVM or Vela, cannot compile it)."""
    from tiergate.execution.engine import connect, with_retries

    if dc.compile is None:
        raise InputError(f"{dc.name}: runtime {dc.runtime} does not compile its artifact")
    tool = toolchain(dc)
    t0 = time.monotonic()
    own = client is None
    client = client or with_retries(lambda: connect(dc.docker_host), what=f"connecting to {dc.docker_host}")
    try:
        shapes = tool.shapes(dc, artifact, input_shapes)
        image = ensure_compiler_image(dc, client=client, ca_bundle=ca_bundle)
        key = compile_key(dc, artifact.sha256, shapes, image.tag)
        folder = state.compiled_folder(key)
        with state.key_lock(f"compile-{key}"):        # one compile of a key at a time, across gates
            if state.cached_folder(folder, "compiled library"):
                os.utime(folder)       # last used now: tiergate gc's --older-than and in-progress rules see it
                if (folder / ERROR).is_file():      # the compiler refused the model (published without its output)
                    raise InputError(f"{_refusal(dc, artifact, folder)} (recorded when this compile first failed; "
                                     f"tiergate gc removes the record)")
                return Compiled(key, folder, read_meta(folder, tool.meta), image.tag, True, time.monotonic() - t0,
                                tool, Path(artifact.path))
            staging = state.part_path(folder)
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            refused = None
            try:
                try:
                    _compile(client, image, dc, artifact, shapes, staging)
                except InputError as exc:
                    if not (staging / ERROR).is_file():   # a timeout, OOM or crash: not recorded, tried again
                        raise
                    refused = exc                         # the compiler refused the model: the same key always will
                    for name in tool.product:
                        (staging / name).unlink(missing_ok=True)
                state.write_compile_source(staging, artifact.sha256, dc.name, image.tag)
                state.publish_folder(staging, folder)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            if refused is not None:
                raise refused
            return Compiled(key, folder, read_meta(folder, tool.meta), image.tag, False, time.monotonic() - t0, tool,
                            Path(artifact.path))
    finally:
        if own:
            client.close()


def read_meta(folder: Path, name: str = META) -> dict:
    record = state.compile_record(folder, name)
    if record is None:
        raise InputError(f"{folder}: no readable {name}")
    return record


def _compile(client, image: CompilerImage, dc: DeviceClass, artifact, shapes: dict, work: Path) -> None:
    """One compile container: the model in, the compiler's files (model.so and tvm-meta.json, or Vela's) or
    error.json out, into `work`."""
    from tiergate.execution import janitor

    tool = toolchain(dc)
    command = tool.command(dc, artifact, shapes)
    try:
        container = client.containers.create(
            image.image_id, command=command, network_mode="none", user="65534:65534", init=True,
            tmpfs={"/tmp": "rw,nosuid,nodev,size=1g,mode=1777"}, cap_drop=["ALL"],
            security_opt=["no-new-privileges"], mem_limit=tool.memory, memswap_limit=tool.memory,
            labels={f"{LABEL}.compile": dc.name, **janitor.owner_labels()})
    except docker.errors.DockerException as exc:
        raise EnvironmentProblem(f"{dc.name}: the {tool.name} compile container could not be created: "
                                 f"{one_line(exc)}") from None
    try:
        if not container.put_archive("/in", _model_tar(artifact)):
            raise EnvironmentProblem(f"{dc.name}: could not copy the model into the {tool.name} compile container")
        container.start()
        try:
            code = container.wait(timeout=tool.timeout_s)["StatusCode"]
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            container.kill()
            raise InputError(f"{dc.name}: {tool.name}'s compile of {Path(artifact.path).name} ran past "
                             f"{tool.timeout_s} s") from None
        container.reload()
        _fetch(container, work, tool)
        log = container.logs(tail=20).decode("utf-8", "replace")
        oom = bool(container.attrs["State"].get("OOMKilled"))
    except docker.errors.DockerException as exc:
        raise EnvironmentProblem(f"{dc.name}: the {tool.name} compile container failed: {one_line(exc)}") from None
    finally:
        try:
            container.remove(force=True)
        except docker.errors.DockerException:
            pass
    name = Path(artifact.path).name
    if (work / ERROR).is_file():
        raise InputError(_refusal(dc, artifact, work, _last(log)))
    if oom:
        raise InputError(f"{dc.name}: {tool.name}'s compile of {name} ran out of memory ({tool.memory})")
    if code != 0 or not (work / tool.meta).is_file() or not (work / tool.product[0]).is_file():
        raise InputError(f"{dc.name}: {tool.name}'s compile of {name} exited with code {code}: {_last(log)}")


def _refusal(dc: DeviceClass, artifact, folder: Path, log_line: str = "") -> str:
    """The one line for a model the class's compiler refused, from the compile's error.json in `folder`."""
    try:
        why = str(json.loads((Path(folder) / ERROR).read_text()).get("error", ""))
    except (OSError, ValueError, AttributeError):
        why = ""
    return (f"{dc.name}: {toolchain(dc).name} cannot compile {Path(artifact.path).name}: "
            f"{why or log_line or 'no reason given'}")


def _model_tar(artifact) -> bytes:
    """The model (named model.onnx) and its external-data files (their own names), readable by anyone."""
    from tiergate.execution.docker_backend import readonly_tar

    path = Path(artifact.path)
    return readonly_tar([(path, f"model{path.suffix}")] + [(path.parent / loc, loc) for loc in artifact.external_data])


def _fetch(container, work: Path, tool: Toolchain) -> None:
    """The compile's files from /out (only the names it writes), within the output limit (docker_backend.download)."""
    from tiergate.execution.docker_backend import download

    download(container, work, lambda name: name in (*tool.product, ERROR))


def _last(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return lines[-1][:400] if lines else "no output"


def compiled_graph(dc: DeviceClass, artifact, image=None, compiled_artifact: Compiled | None = None):
    """The RuntimeGraph of a compiled artifact on its class: from the compile cache's record of the image's compile
    (its compile-key label) or of `compiled_artifact`. InputError when the record is gone (tiergate gc)."""
    from tiergate.runtime_graph import from_describe

    tool = toolchain(dc)
    if compiled_artifact is not None:
        folder, image_ref, image_id = compiled_artifact.folder, "", ""
    else:
        key = (image.labels or {}).get(KEY_LABEL) if image is not None else None
        if not key:
            raise InputError(f"{dc.name}: the image {getattr(image, 'tag', '?')} names no compile of the artifact")
        folder, image_ref, image_id = state.compiled_folder(key), image.tag, image.image_id
        if not state.cached_folder(folder, "compiled library"):
            raise InputError(f"{dc.name}: the compile record of {Path(artifact.path).name} is no longer cached")
    return from_describe(tool.describe(read_meta(folder, tool.meta), dc.machine), None, target=dc.name, tier=dc.tier,
                         runtime=dc.runtime, emulated=dc.emulated, image=image_ref, image_id=image_id,
                         artifact_sha256=artifact.sha256, seconds=0.0, cached=True)

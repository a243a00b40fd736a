"""The build step: one container image per device class, with the artifact as the last layer.

Modules (each a home of its own; they share engine.py's public helpers):
- runtime.py: the runtime image of a class (stage 1 below);
- artifact_image.py: the artifact image FROM it (stage 2), `build_image`;
- compiling.py: the compile stage of the classes whose runtime compiles the artifact (TVM: tvm.py; Arm's Vela for
  Ethos-U: vela.py; their common `Toolchain` in toolchain.py): the compiler image, the compile in a container of it,
  the compile cache (docs/tvm.md, docs/npu.md);
- engine.py: a docker build without network, the build lock, the base image and its Python, content digests.


Two stages of caching:

1. a runtime image per (recipe, build arguments, arch, pinned lock, base image,
   harness folder, CA bundle, pip settings), built once from the one recipe
   containers/runtime/Dockerfile with the device class's build arguments
   (`[build]` in targets/*.toml: the lock containers/requirements/<name>.txt and
   extra environment such as the NVIDIA variables);
2. a thin artifact image `FROM` it (containers/artifact.Dockerfile) that copies
   the artifact last and carries the labels.

Each tag is a content hash of everything that went into the image, so an
unchanged input gives the same tag and the image is reused without building
(`BuiltImage.reused`). Python packages for the runtime image are, by default,
downloaded on the host for the target platform (`pip download --platform ...
--only-binary=:all:`) and installed offline in the image; `pip_mode="image"`
runs pip inside the build instead (with the CA bundle and pip.conf copied in).
See docs/execution.md for the measurements behind that default.
"""

from __future__ import annotations

from tiergate.artifact.files import artifact_files, onnx_external_files  # noqa: F401 - re-exported
from tiergate.build.artifact_image import (ARTIFACT_RECIPE, MODEL_DIR, artifact_context,  # noqa: F401 - the API
                                           artifact_image_tag, build_image, image_labels)
from tiergate.build.engine import (base_python_version, building, cache_dir, content_digest,  # noqa: F401
                                   device_class_of, docker_build, ensure_base_image, lineage_problems, local_image,
                                   normalise_modes, one_line, reusable)
from tiergate.build.runtime import (DEFAULT_BASE_IMAGE, HARNESS_DIR, PIP_MODES, RECIPE,  # noqa: F401
                                    RuntimeImage, RuntimePlan, ca_bundle_bytes, download_wheels, emulator_path,
                                    ensure_runtime_image, harness_files, harness_sha256, image_pip_conf,
                                    install_on_host, lock_versions, plan_runtime_image, platform_tags, render_lock,
                                    runtime_build_args)
from tiergate.images import HOST_CA_BUNDLE, HOST_PIP_CONF, LABEL, BuiltImage  # noqa: F401 - re-exported

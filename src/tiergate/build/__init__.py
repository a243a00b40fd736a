"""The build step: one container image per device class, with the artifact as the last layer.

Modules (each a home of its own; they share engine.py's public helpers):
- runtime.py: the runtime image of a class (stage 1 below);
- artifact_image.py: the artifact image FROM it (stage 2), `build_image`;
- compiling.py: the compile stage of the classes whose runtime compiles the artifact (TVM: tvm.py; Arm's Vela for
  Ethos-U: vela.py; their common `Toolchain` in toolchain.py): the compiler image, the compile in a container of it,
  the compile cache (docs/tvm.md, docs/npu.md);
- engine.py: a docker build without network, the build lock, the base image and its Python, content digests.


The two stages of caching (a runtime image per class's inputs, a thin artifact image FROM it, each tagged by a
content hash) are described in runtime.py's docstring and docs/execution.md.
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

# tiergate TVM compiler image: Apache TVM (Relax's ONNX frontend), onnx and the linkers that export a compiled
# library for each device class's architecture (gcc for x86_64; gcc-aarch64-linux-gnu for aarch64, cross). Built
# by tiergate.compiler from a context it assembles: this file, site-packages/ (containers/tvm/requirements.txt's
# wheels for x86_64, installed on the host: no pip here) and tiergate_tvm_compile.py; tagged by a content hash of
# all of them, the base image and the lock, and reused. apt-get needs the build's network (the engine's host's).
# The compile runs as a container of it: /in holds the model (copied in before the start), /out gets model.so and
# tvm-meta.json (or error.json), read back by the host. No network then.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      gcc g++ libc6-dev gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null && \
    rm -rf /var/lib/apt/lists/*
COPY site-packages/ /opt/tiergate/site-packages/
COPY tiergate_tvm_compile.py /opt/tiergate/tvm/tiergate_tvm_compile.py
RUN mkdir -p /in /out && chown 65534:65534 /in /out
ENV PYTHONPATH=/opt/tiergate/site-packages PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 65534:65534
WORKDIR /tmp
ENTRYPOINT ["python3", "-s", "/opt/tiergate/tvm/tiergate_tvm_compile.py"]

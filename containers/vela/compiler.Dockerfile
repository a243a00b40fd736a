# tiergate Ethos-U compiler image: Arm's Vela (ethos-u-vela at the device class's runtime_version) and its two
# dependencies, nothing else. Built by tiergate.vela from a context it assembles: this file, site-packages/
# (containers/vela/requirements.txt's wheels for x86_64, installed on the host: no pip and no network here) and
# tiergate_vela_compile.py; tagged by a content hash of all of them, the base image and the lock, and reused.
# The compile runs as a container of it: /in holds the model (copied in before the start), /out gets
# model_vela.tflite, vela-meta.json, per-layer.csv and summary.csv (or error.json), read back by the host. No network.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY site-packages/ /opt/tiergate/site-packages/
COPY tiergate_vela_compile.py /opt/tiergate/vela/tiergate_vela_compile.py
RUN mkdir -p /in /out && chown 65534:65534 /in /out
ENV PYTHONPATH=/opt/tiergate/site-packages PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 65534:65534
WORKDIR /tmp
ENTRYPOINT ["python3", "-s", "/opt/tiergate/vela/tiergate_vela_compile.py"]

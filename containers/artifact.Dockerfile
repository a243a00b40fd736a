# tiergate artifact image: the runtime image plus the artifact, copied last, so a
# new artifact rebuilds only this thin layer. Labels (artifact sha, fingerprint,
# runtime versions, device class, cost tags) are added by tiergate.build.
ARG RUNTIME_IMAGE
FROM ${RUNTIME_IMAGE}
COPY model/ /opt/tiergate/model/

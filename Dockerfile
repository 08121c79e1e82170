# The Phalanx image: the daemon and the embedded trainer in one virtual environment.
#
#   CPU:  docker build -t phalanx:0.1.0 .
#   GPU:  docker build -t phalanx:0.1.0-cu128 \
#           --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#
# CUDA wheels bring their own CUDA libraries; the driver comes from the host
# (NVIDIA container toolkit / the Kubernetes device plugin), so no CUDA base image.

# Both stages use the same base, so the venv's interpreter links
# (/usr/local/bin/python3.11) are valid when the venv is copied over.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS builder
# The Makefile's pinned version; torch comes first from the PyTorch index so
# that installing the project afterwards finds it satisfied and pulls no
# other torch build from PyPI.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/phalanx/.venv/bin:$PATH
RUN python -m venv /opt/phalanx/.venv
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
# Only what the distribution is built from (see .dockerignore): source edits
# elsewhere (tests, docs, ops) do not invalidate the layers above.
COPY pyproject.toml README.md ./
COPY daemon/ daemon/
COPY trainer/ trainer/
RUN pip install . && pip check

FROM ${BASE_IMAGE} AS runtime
# A fixed uid/gid: Kubernetes' runAsNonRoot can only verify a numeric user, and
# every node must write the shared checkpoint volume as the same owner.
RUN groupadd --system --gid 10001 phalanx \
 && useradd --system --uid 10001 --gid phalanx --no-create-home \
        --home-dir /var/lib/phalanx --shell /usr/sbin/nologin phalanx \
 && install -d -o phalanx -g phalanx -m 0750 /var/lib/phalanx \
 && install -d -m 0755 /etc/phalanx
COPY --from=builder /opt/phalanx/.venv /opt/phalanx/.venv
ENV PATH=/opt/phalanx/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/phalanx \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /var/lib/phalanx
# node.http_port (/metrics, /healthz, /readyz, /status) and node.lighthouse_port.
# Ranks also listen on ephemeral ports, reached by node.advertise_host.
EXPOSE 29520 29510
# Liveness for plain Docker/Podman (Kubernetes uses its own probes, and OCI
# image format ignores HEALTHCHECK: build with --format docker under Podman).
# Python, since slim images have no curl; urlopen raises on any non-2xx answer.
# The daemon listens on the address its advertised name (by default the
# container's hostname) resolves to, not on loopback: dial the hostname.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import socket, urllib.request; urllib.request.urlopen(f'http://{socket.gethostname()}:29520/healthz', timeout=4)"]
ENTRYPOINT ["phalanx"]
CMD ["run", "--config", "/etc/phalanx/job.toml"]

# gpufleet image: the controller (default command) and the node agent (`agent ...`), as the
# Kubernetes manifests of `gpufleet config kubernetes` run it. Build from the repository root:
#
#   docker build -t ghcr.io/gpufleet/gpufleet:0.1.0 .
#
# Multi-stage: the build stage installs the package (the same `pip install .` of pyproject.toml
# that CI installs, without the dev extras) into a virtual environment; the final stage holds
# that environment and the Python runtime only: no compiler, no sources, no tests, no secrets.
# The database URL and tokens come at run time (environment from a Secret, files), never here.
# Not built in CI (no container registry is reachable there); docs/control-plane.md.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /build
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m venv /opt/gpufleet \
    && /opt/gpufleet/bin/pip install --upgrade pip \
    && /opt/gpufleet/bin/pip install . \
    && /opt/gpufleet/bin/gpufleet --help > /dev/null

FROM ${PYTHON_IMAGE}
ARG GPUFLEET_IMAGE=ghcr.io/gpufleet/gpufleet
ARG GPUFLEET_VERSION=0.1.0
LABEL org.opencontainers.image.title="gpufleet" \
      org.opencontainers.image.description="Plan, validate and operate GPU fleets" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${GPUFLEET_VERSION}" \
      org.opencontainers.image.ref.name="${GPUFLEET_IMAGE}:${GPUFLEET_VERSION}"
RUN groupadd --system --gid 10001 gpufleet \
    && useradd --system --uid 10001 --gid gpufleet --home-dir /var/lib/gpufleet \
       --create-home --shell /usr/sbin/nologin gpufleet
COPY --from=build /opt/gpufleet /opt/gpufleet
ENV PATH=/opt/gpufleet/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GPUFLEET_DATA_DIR=/var/lib/gpufleet/controller
USER 10001:10001
WORKDIR /var/lib/gpufleet
EXPOSE 8080 9400
ENTRYPOINT ["gpufleet"]
CMD ["controller", "--host", "0.0.0.0", "--port", "8080"]

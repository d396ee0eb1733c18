#!/usr/bin/env bash
# Prepares .gpu-wheels/: the wheels gpufleet needs that the GPU machine's image lacks
# (it has torch, numpy, nvidia-ml-py, typer, rich, pyyaml, prometheus-client, httpx; it has no
# registry access). Run here, then carry .gpu-wheels to the GPU machine with the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpu-wheels
mkdir -p "$dest"
grep -qx "/$dest/" .git/info/exclude 2>/dev/null || echo "/$dest/" >> .git/info/exclude
# The GPU image runs CPython 3.12 on x86-64 (device/KINDS.md).
python3 -m pip download -q --only-binary :all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any \
  -d "$dest" pydantic pydantic-core pint flexcache flexparser platformdirs annotated-types \
  typing-inspection fastapi starlette uvicorn sqlalchemy alembic mako greenlet
python3 -m pip wheel -q --no-deps -w "$dest" .
ls "$dest"

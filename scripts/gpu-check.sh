#!/usr/bin/env bash
# Runs on a machine with an NVIDIA GPU: the `gpu`-marked tests and the real-hardware benchmarks,
# then prints a short report. Read-only on the GPU: it never changes power limits, clocks, MIG,
# persistence or ECC. Results go to $OUT (or ./out).
#
#   scripts/gpu-wheels.sh                 # here, once: wheels the GPU image lacks
#   run(command="bash scripts/gpu-check.sh", carry=[".gpu-wheels"])   # on the GPU machine
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}

{
  echo "== gpufleet gpu-check $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,pcie.link.gen.max --format=csv 2>&1 | head -5
  if [ -d .gpu-wheels ]; then
    $PY -m venv --system-site-packages /tmp/gf-venv && PY=/tmp/gf-venv/bin/python
    $PY -m pip install -q --no-index --find-links .gpu-wheels gpufleet 2>&1 | tail -3
  else
    export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
  fi
  $PY -c "import gpufleet, pynvml; print('gpufleet', gpufleet.__version__, 'nvidia-ml-py ok')"

  echo "== gpu-marked tests"
  timeout 300 $PY -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -25

  echo "== benchmarks/sample_cost.py"
  [ -f benchmarks/sample_cost.py ] && timeout 120 $PY benchmarks/sample_cost.py 2>&1 | tail -20
  echo "== benchmarks/agent_overhead.py"
  [ -f benchmarks/agent_overhead.py ] && timeout 120 $PY benchmarks/agent_overhead.py --seconds 10 2>&1 | tail -20
  echo "== benchmarks/validate_overhead.py"
  [ -f benchmarks/validate_overhead.py ] && timeout 240 $PY benchmarks/validate_overhead.py 2>&1 | tail -20
  echo "== gpufleet validate --level 2 on the real GPU (read-only: no setting is changed)"
  timeout 300 $PY -m gpufleet validate --level 2 --out "$OUT/validate-l2.json" --html "$OUT/validate-l2.html" 2>&1 | tail -25
  echo "validate rc=$?"
  echo "== gpufleet health"
  timeout 60 $PY -m gpufleet health --json > "$OUT/health.json" 2>&1; echo "health rc=$?"
  echo "== gpufleet inventory / doctor on the real GPU"
  $PY -m gpufleet inventory --json > "$OUT/inventory.json" 2>&1; echo "inventory rc=$?"
  $PY -m gpufleet doctor 2>&1 | tail -20
} 2>&1 | tee "$OUT/gpu-check.log"

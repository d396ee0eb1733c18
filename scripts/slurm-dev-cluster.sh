#!/usr/bin/env bash
# A real Slurm cluster on loopback for development: munged, slurmctld and 3 slurmd "nodes"
# (gpu1..gpu3, 2 fake H100 each) under $GPUFLEET_SLURM_DEV (default /tmp/gpufleet-slurm-dev).
# Needs root and Debian's packages: apt-get install -y slurmctld slurmd slurm-client munge
#   scripts/slurm-dev-cluster.sh up        # then: export SLURM_CONF=... (printed)
#   scripts/slurm-dev-cluster.sh status
#   scripts/slurm-dev-cluster.sh down
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
  if [[ -x "$here/.venv/bin/python" ]]; then py="$here/.venv/bin/python"; else py=python3; fi
fi
exec "$py" -m gpufleet.schedulers.slurm.devcluster "$@"

#!/usr/bin/env bash
# A real Slurm cluster on loopback for development: munged, slurmctld and 3 slurmd "nodes"
# (gpu1..gpu3, 2 fake H100 each) under $GPUFLEET_SLURM_DEV (default /tmp/gpufleet-slurm-dev).
# Needs root and Debian's packages: apt-get install -y slurmctld slurmd slurm-client munge
#   scripts/slurm-dev-cluster.sh up        # then: export SLURM_CONF=... (printed)
#   scripts/slurm-dev-cluster.sh status
#   scripts/slurm-dev-cluster.sh down
# Options (scripts/slurm-dev-cluster.sh --help lists them all):
#   --dir/--state-dir DIR   state, spool, logs and munge socket (default as above)
#   --slurmctld-port PORT   default: a free range picked at random
#   --slurmd-port PORTS     first of --nodes consecutive ports, or one per node (a,b,c)
#   --nodes N --gpus G      nodes and fake GPUs per node
#   up --print-config       print slurm.conf/gres.conf as they would be written; start nothing
# Two clusters side by side: give each its own --dir and ports, e.g.
#   scripts/slurm-dev-cluster.sh up --dir /tmp/c1 --slurmctld-port 16817 --slurmd-port 16818
#   scripts/slurm-dev-cluster.sh up --dir /tmp/c2 --slurmctld-port 26817 --slurmd-port 26818
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
  if [[ -x "$here/.venv/bin/python" ]]; then py="$here/.venv/bin/python"; else py=python3; fi
fi
exec "$py" -m gpufleet.schedulers.slurm.devcluster "$@"

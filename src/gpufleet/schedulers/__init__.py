"""Scheduler backends behind one protocol: `embedded`, `slurm`, `kubernetes`."""

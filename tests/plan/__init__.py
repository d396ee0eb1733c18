"""Tests of the planner (gpufleet.plan) and `gpufleet plan`."""

"""gpufleet: plan, validate and operate GPU fleets."""

__version__ = "0.1.0"

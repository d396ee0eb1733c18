"""gpufleet.telemetry (see DESIGN.md)."""

"""gpufleet.validate (see DESIGN.md)."""

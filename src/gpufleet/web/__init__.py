"""gpufleet.web (see DESIGN.md)."""

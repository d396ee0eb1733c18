"""gpufleet.control (see DESIGN.md)."""

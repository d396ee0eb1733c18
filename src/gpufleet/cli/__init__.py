"""The `gpufleet` command line: parses, wires, prints (Rich tables, progress, --json)."""

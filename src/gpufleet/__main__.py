"""`python -m gpufleet` runs the CLI."""

from gpufleet.cli.entry import main

main()

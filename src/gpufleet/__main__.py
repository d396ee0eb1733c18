"""`python -m gpufleet` runs the CLI."""

from gpufleet.cli.app import main

main()

"""Rigs for tests and benchmarks: a real controller on loopback and the real agents of a
simulated fleet (`gpufleet.testing.testbed`). No module under ``src/`` imports this package."""

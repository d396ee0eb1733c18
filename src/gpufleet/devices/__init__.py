"""The device layer: the `GpuBackend` protocol, the NVML backend, the NVML simulator, nvidia-smi
parsers, and the records they all produce."""

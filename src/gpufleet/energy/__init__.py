"""Energy: measure a workload's throughput and energy against the GPU power limit, recommend a
limit (least energy within a slowdown budget, and the energy-delay optimum), apply and restore
limits through NVML. Fleet accounting comes later (issue 16)."""

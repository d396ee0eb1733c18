"""The planner: workload sizing, hardware, facility, fabric, storage, cost (pure functions)."""

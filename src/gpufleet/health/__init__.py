"""Health rules: pure functions from samples, events and device info to findings, a registry,
and a tracker that clears findings explicitly (hardware ones only by acknowledgement)."""

"""Time series: raw series reads (memory or Prometheus), forwarding to the replica holding them,
rollups."""

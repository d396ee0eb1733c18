"""The control plane's kernel: the store and its one writer, the node cache and snapshots,
lifecycle and transitions, remediation policy and circuit breaker, telemetry rings, the energy
ledger, tokens, and the ports through which it reaches scheduling and notifications."""

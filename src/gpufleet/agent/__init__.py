"""The node agent: sampler + local health + /metrics + push to the control plane."""

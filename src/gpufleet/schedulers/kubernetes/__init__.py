"""Kubernetes: the scheduler backend (cordon, taint, evict, label) and generated manifests."""

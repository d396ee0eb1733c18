"""Energy accounting reads: reports by job, tenant, node, model and day."""

"""Several replicas on one PostgreSQL: the leader lease with its fencing token, and replica sync."""

"""Maintenance campaigns: the spec, the engine that advances nodes through their steps, operations,
drains and proposals."""

"""The rule set: every rule module, imported so that each registers its rules in the one
registry (`gpufleet.health.registry.RULES`). A new rule module is added to the import below."""

from __future__ import annotations

from gpufleet.health import rules_gpu, rules_memory, rules_node, rules_nvlink  # noqa: F401
from gpufleet.health.registry import RULES, Rule


def all_rules() -> dict[str, Rule]:
    """Every registered rule."""
    return RULES

"""The one registry of health rules: name -> `Rule` (scope, description, default-on flag,
thresholds model, pure function).

A rule is a pure function ``fn(ctx, params) -> Iterable[Finding]``: ``ctx`` is a `GpuContext`
(scope ``gpu``) or a `NodeContext` (scope ``node``); ``params`` is an instance of the rule's
`RuleParams` subclass, filled from the ``health.rules.<name>`` section of the config. The rule
modules register themselves here when imported; `gpufleet.health.rules.all_rules` imports them
all (so this module imports none of them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gpufleet.catalog import XidAction
from gpufleet.health.context import GpuContext
from gpufleet.health.types import Finding, Severity

Scope = Literal["gpu", "node"]
RuleFn = Callable[[Any, Any], Iterable[Finding]]


class RuleParams(BaseModel):
    """Thresholds of one rule; every rule's model adds its own fields. ``enabled`` None means
    the rule's default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool | None = None


@dataclass(frozen=True)
class Rule:
    """One registered rule."""

    name: str
    scope: Scope
    description: str
    default_enabled: bool
    params_model: type[RuleParams]
    fn: RuleFn


RULES: dict[str, Rule] = {}


def register_rule(
    name: str,
    *,
    scope: Scope,
    description: str,
    params: type[RuleParams] = RuleParams,
    default_enabled: bool = True,
) -> Callable[[RuleFn], RuleFn]:
    """Decorator: add a rule function to the registry under ``name``."""

    def deco(fn: RuleFn) -> RuleFn:
        if name in RULES:
            raise ValueError(f"health rule {name!r} registered twice")
        RULES[name] = Rule(name, scope, description, default_enabled, params, fn)
        return fn

    return deco


def gpu_finding(
    ctx: GpuContext,
    rule: str,
    code: str,
    severity: Severity,
    message: str,
    *,
    action: XidAction = XidAction.NONE,
    evidence: dict[str, Any] | None = None,
    sticky: bool = False,
    occurrence: str = "",
) -> Finding:
    """A finding about the GPU of ``ctx`` (times are filled in by the tracker)."""
    return Finding(
        rule=rule,
        code=code,
        severity=severity,
        component=ctx.component,
        message=f"GPU {ctx.index}: {message}",
        action=action,
        evidence=evidence or {},
        sticky=sticky,
        gpu_index=ctx.index,
        occurrence=occurrence,
    )


def flag_finding(
    ctx: GpuContext,
    rule: str,
    field: str,
    code: str,
    severity: Severity,
    message: str,
    *,
    action: XidAction,
    sticky: bool = False,
) -> Iterator[Finding]:
    """`gpu_finding` while the newest sample's flag ``field`` is set (evidence {field: True})."""
    if ctx.window.latest(field):
        yield gpu_finding(
            ctx, rule, code, severity, message, action=action, evidence={field: True}, sticky=sticky
        )

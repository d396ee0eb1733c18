"""Health configuration: which rules run and their thresholds (the ``health:`` YAML section).

    health:
      xid_quiet_s: 300          # optional shortcut for rules.xid.quiet_s
      rules:
        persistence_mode: {enabled: false}
        sbe_rate: {max_per_hour: 20}

Each ``rules.<name>`` section is validated against that rule's thresholds model; an unknown
rule or field, or a bad value, is a `ConfigError` naming the file and the field path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from gpufleet.errors import ConfigError, UnknownNameError
from gpufleet.health.registry import Rule, RuleParams
from gpufleet.health.rules import all_rules
from gpufleet.yamldoc import read_text_file, read_yaml


class HealthConfig(BaseModel):
    """Rules switched on or off, and their thresholds."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    rules: dict[str, RuleParams] = {}

    @field_validator("rules", mode="before")
    @classmethod
    def _rules(cls, value: Any) -> dict[str, RuleParams]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ValueError("expected a mapping of rule name to settings")
        registry = all_rules()
        out: dict[str, RuleParams] = {}
        for name, raw in value.items():
            rule = registry.get(str(name))
            if rule is None:
                err = UnknownNameError("health rule", str(name), sorted(registry))
                raise ValueError(f"{name}: {err}")
            if isinstance(raw, RuleParams):
                out[rule.name] = raw
                continue
            if raw is None:
                raw = {}
            if isinstance(raw, bool):
                raw = {"enabled": raw}
            try:
                out[rule.name] = rule.params_model.model_validate(raw)
            except ValidationError as exc:
                first = exc.errors()[0]
                loc = ".".join(str(p) for p in first["loc"])
                where = f"{name}.{loc}" if loc else str(name)
                raise ValueError(f"{where}: {first['msg']}") from exc
        return out

    def params(self, rule: Rule | str) -> RuleParams:
        """The configured thresholds of ``rule`` (its defaults when not configured)."""
        r = all_rules()[rule] if isinstance(rule, str) else rule
        return self.rules.get(r.name) or r.params_model()

    def enabled(self, rule: Rule | str) -> bool:
        r = all_rules()[rule] if isinstance(rule, str) else rule
        flag = self.params(r).enabled
        return r.default_enabled if flag is None else flag

    def enabled_rules(self) -> list[Rule]:
        return [r for r in all_rules().values() if self.enabled(r)]


def health_config_from_mapping(doc: Any, source: str = "<config>") -> HealthConfig:
    """Build a config from the ``health:`` mapping (or a document that holds one)."""
    if doc is None:
        return HealthConfig()
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: health: expected a mapping")
    section = doc.get("health", doc) if "health" in doc else doc
    if section is None:
        return HealthConfig()
    if not isinstance(section, dict):
        raise ConfigError(f"{source}: health: expected a mapping")
    section = dict(section)
    if "xid_quiet_s" in section:  # shortcut
        quiet = section.pop("xid_quiet_s")
        rules = dict(section.get("rules") or {})
        xid = rules.get("xid")
        rules["xid"] = {**(xid if isinstance(xid, dict) else {}), "quiet_s": quiet}
        section["rules"] = rules
    try:
        return HealthConfig.model_validate(section)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        msg = str(first["msg"]).removeprefix("Value error, ")
        if loc == "rules" and ": " in msg:  # the rules validator names the rule and field
            where, _, msg = msg.partition(": ")
            loc = f"rules.{where}"
        raise ConfigError(f"{source}: health.{loc}: {msg}") from exc


def load_health_config(path: Path | str | None) -> HealthConfig:
    """Load the ``health:`` section of a YAML file; None gives the defaults."""
    if path is None:
        return HealthConfig()
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such config file")
    doc = read_yaml(read_text_file(p, "config file"), str(p)).data
    return health_config_from_mapping(doc, source=str(p))

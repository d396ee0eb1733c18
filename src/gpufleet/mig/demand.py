"""MIG demand: instances per profile per tenant, from a one-line string or a YAML file.

String form (``--demand``): entries separated by commas or semicolons, each
``[tenant:] N x PROFILE``; an entry without a tenant belongs to the tenant named before it
(or ``default``)::

    team-a: 6 x 1g.18gb, 1 x 3g.71gb; team-b: 2 x 3g.71gb

File form (``--demand-file``)::

    demand:
      team-a: {1g.18gb: 6, 3g.71gb: 1}
      team-b: {3g.71gb: 2}

A target mix (``--mix "1g.18gb:4, 3g.71gb:1"``) gives ratios instead of counts; the planner
scales it to the largest multiple the fleet holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpufleet.errors import ConfigError, ParseError, UnknownNameError

__all__ = ["Demand", "DemandItem", "load_demand_file", "parse_demand", "parse_mix"]

_ENTRY = re.compile(
    r"^\s*(?:(?P<tenant>[A-Za-z0-9][\w.\-]*)\s*:\s*)?(?P<n>\d+)\s*[x×*]\s*(?P<profile>\S+)\s*$"
)


@dataclass(frozen=True)
class DemandItem:
    """``count`` instances of ``profile`` wanted by ``tenant``."""

    tenant: str
    profile: str
    count: int


@dataclass(frozen=True)
class Demand:
    """Everything asked for, in the order given (the order first-fit places it)."""

    items: tuple[DemandItem, ...]

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for it in self.items:
            out[it.profile] = out.get(it.profile, 0) + it.count
        return out

    @property
    def tenants(self) -> list[str]:
        return list(dict.fromkeys(it.tenant for it in self.items))

    def by_tenant(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for it in self.items:
            d = out.setdefault(it.tenant, {})
            d[it.profile] = d.get(it.profile, 0) + it.count
        return out

    def scaled(self, k: int) -> Demand:
        return Demand(tuple(DemandItem(i.tenant, i.profile, i.count * k) for i in self.items))


def _check_profile(name: str, known: list[str] | None) -> str:
    if known is None or name in known:
        return name
    lowered = {k.lower(): k for k in known}
    if name.lower() in lowered:
        return lowered[name.lower()]
    raise UnknownNameError("MIG profile", name, known)


def parse_demand(text: str, known: list[str] | None = None, source: str = "--demand") -> Demand:
    """Parse the one-line form; ``known`` profile names give did-you-mean on a typo."""
    items: list[DemandItem] = []
    tenant = "default"
    for raw in re.split(r"[,;\n]", text):
        if not raw.strip():
            continue
        m = _ENTRY.match(raw)
        if m is None:
            raise ParseError(source, repr(raw.strip()), "expected '[tenant:] N x PROFILE'")
        tenant = m["tenant"] or tenant
        count = int(m["n"])
        if count <= 0:
            raise ParseError(source, repr(raw.strip()), "count must be at least 1")
        items.append(DemandItem(tenant, _check_profile(m["profile"], known), count))
    if not items:
        raise ConfigError(f"{source}: no demand given")
    return Demand(tuple(items))


def parse_mix(text: str, known: list[str] | None = None, source: str = "--mix") -> Demand:
    """A target mix ``PROFILE:WEIGHT, ...`` (tenant ``mix``)."""
    items: list[DemandItem] = []
    for raw in re.split(r"[,;]", text):
        if not raw.strip():
            continue
        name, sep, weight = raw.strip().rpartition(":")
        if not sep or not weight.strip().isdigit() or int(weight) <= 0:
            raise ParseError(source, repr(raw.strip()), "expected 'PROFILE:WEIGHT' (WEIGHT >= 1)")
        items.append(DemandItem("mix", _check_profile(name.strip(), known), int(weight)))
    if not items:
        raise ConfigError(f"{source}: empty mix")
    return Demand(tuple(items))


def load_demand_file(path: Path, known: list[str] | None = None) -> Demand:
    """Load the YAML form; errors name the file, the line and the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        raise ParseError(str(path), "YAML", str(exc)) from exc
    src = str(path)
    if not isinstance(root, yaml.MappingNode):
        raise ParseError(src, "line 1", "expected a mapping with a 'demand' key")
    demand_node = next((v for k, v in root.value if k.value == "demand"), None)
    if not isinstance(demand_node, yaml.MappingNode):
        raise ParseError(src, "demand", "expected 'demand:' mapping tenant -> {profile: count}")
    items: list[DemandItem] = []
    for tkey, tval in demand_node.value:
        tenant = str(tkey.value)
        if not isinstance(tval, yaml.MappingNode):
            where = f"line {tkey.start_mark.line + 1}: demand.{tenant}"
            raise ParseError(src, where, "expected a mapping profile -> count")
        for pkey, pval in tval.value:
            where = f"line {pkey.start_mark.line + 1}: demand.{tenant}.{pkey.value}"
            if not (isinstance(pval, yaml.ScalarNode) and str(pval.value).isdigit()):
                raise ParseError(src, where, f"count must be a whole number, not {pval.value!r}")
            count = int(pval.value)
            if count <= 0:
                raise ParseError(src, where, "count must be at least 1")
            try:
                profile = _check_profile(str(pkey.value), known)
            except UnknownNameError as exc:
                raise ConfigError(f"{src}: {where}: {exc.message}", hint=exc.hint) from exc
            items.append(DemandItem(tenant, profile, count))
    if not items:
        raise ConfigError(f"{src}: demand is empty")
    return Demand(tuple(items))

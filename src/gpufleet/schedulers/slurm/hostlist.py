"""Slurm hostlist expressions: ``gpu[1-3,7]`` to names and back.

Syntax from slurm.conf(5), "NodeName": a numeric range in brackets, zero padding kept
(``gpu[001-128]``), several ranges separated by commas.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpufleet.errors import ConfigError

_TAIL = re.compile(r"^(.*?)(\d+)$")
_BRACKET = re.compile(r"^([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)$")


def expand(expr: str) -> list[str]:
    """Names of one hostlist expression (``a[1-2],b`` -> ``a1 a2 b``)."""
    out: list[str] = []
    for part in _split_top(expr):
        m = _BRACKET.match(part)
        if not m:
            if "[" in part or "]" in part:
                raise ConfigError(f"hostlist {expr!r}: unbalanced brackets in {part!r}")
            out.append(part)
            continue
        head, ranges, tail = m.groups()
        for rng in ranges.split(","):
            lo, _, hi = rng.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ConfigError(f"hostlist {expr!r}: bad range {rng!r}")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{head}{i:0{width}d}{tail}")
    return out


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in expr:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def compress(names: Iterable[str]) -> str:
    """The shortest simple hostlist for ``names`` (order of first appearance per prefix)."""
    items: list[tuple[str, str] | str] = []
    padded: dict[str, set[int]] = {}
    for name in names:
        m = _TAIL.match(name)
        if not m:
            items.append(name)
            continue
        prefix, digits = m.groups()
        items.append((prefix, digits))
        if len(digits) > 1 and digits.startswith("0"):
            padded.setdefault(prefix, set()).add(len(digits))
    groups: dict[tuple[str, int], list[int]] = {}
    order: list[tuple[str, int] | str] = []
    for it in items:
        if isinstance(it, str):
            order.append(it)
            continue
        prefix, digits = it
        width = len(digits) if len(digits) in padded.get(prefix, set()) else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(digits))
    parts: list[str] = []
    for entry in order:
        if isinstance(entry, str):
            parts.append(entry)
            continue
        prefix, width = entry
        nums = sorted(set(groups[entry]))
        if len(nums) == 1:
            parts.append(f"{prefix}{nums[0]:0{width}d}")
            continue
        ranges: list[str] = []
        start = prev = nums[0]
        for n in [*nums[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            lo, hi = f"{start:0{width}d}", f"{prev:0{width}d}"
            ranges.append(lo if start == prev else f"{lo}-{hi}")
            if n is not None:
                start = prev = n
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)

"""Slurm hostlist expressions: ``gpu[01-04,07],login1`` and ``r[1-2]n[1-2]`` to names and back.

The syntax is Slurm's (slurm.conf(5) "NodeName", ``scontrol show hostnames``): names separated by
commas; a name may hold several bracket groups, each a comma list of numbers or ``lo-hi``
ranges, and expands to every combination, the leftmost group varying slowest
(``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2); a range keeps the zero padding of its low end
(``gpu[001-003]``). Two departures from Slurm 22.05, on purpose: an unclosed bracket is an
error (Slurm guesses), and text after the last group is kept (``n[1-2]-ib``; Slurm 22.05
rejects it). Used by validate (``--nodes``, ``--slurm``) and the Slurm backend; imports nothing
above ``gpufleet.errors``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from gpufleet.errors import ConfigError

__all__ = ["compress", "expand"]

_TAIL = re.compile(r"^(.*?)(\d+)$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(expr: str) -> list[str]:
    """Split at commas outside brackets; reject unbalanced or nested brackets."""
    parts, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ConfigError(f"hostlist {expr!r}: nested brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"hostlist {expr!r}: unbalanced brackets")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth != 0:
        raise ConfigError(f"hostlist {expr!r}: unbalanced brackets")
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _numbers(body: str, expr: str) -> list[str]:
    """The numbers of one bracket group (``01-03,7`` -> 01 02 03 7), padding kept."""
    out: list[str] = []
    for rng in body.split(","):
        m = _RANGE.match(rng.strip())
        if m is None:
            raise ConfigError(f"hostlist {expr!r}: bad range {rng!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ConfigError(f"hostlist {expr!r}: range {rng!r} goes backwards")
        out.extend(f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1))
    return out


def _expand_name(name: str, expr: str) -> list[str]:
    pieces = re.split(r"\[([^\[\]]*)\]", name)  # text, group, text, group, ..., text
    texts, groups = pieces[0::2], pieces[1::2]
    choices = [_numbers(g, expr) for g in groups]
    out = []
    for combo in itertools.product(*choices):
        out.append("".join(t + n for t, n in zip(texts, (*combo, ""), strict=True)))
    return out


def expand(expr: str, *, unique: bool = False) -> list[str]:
    """Names of one hostlist expression, in Slurm's order; ``unique`` rejects a repeated name."""
    out: list[str] = []
    for part in _split_top(expr):
        out.extend(_expand_name(part, expr))
    if unique:
        seen: set[str] = set()
        for name in out:
            if name in seen:
                raise ConfigError(f"hostlist {expr!r}: host {name!r} appears twice")
            seen.add(name)
    return out


def compress(names: Iterable[str]) -> str:
    """A short hostlist for ``names``: one bracket group on each name's trailing number.

    Names are grouped by the text before their trailing number (and its zero padding) in order
    of first appearance; numbers within a group are sorted and repeats dropped, so
    ``expand(compress(names))`` holds each name once.
    """
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
    groups: dict[tuple[str, int], set[int]] = {}
    order: list[tuple[str, int] | str] = []
    for it in items:
        if isinstance(it, str):
            if it not in order:
                order.append(it)
            continue
        prefix, digits = it
        width = len(digits) if len(digits) in padded.get(prefix, set()) else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = set()
            order.append(key)
        groups[key].add(int(digits))
    parts: list[str] = []
    for entry in order:
        if isinstance(entry, str):
            parts.append(entry)
            continue
        prefix, width = entry
        nums = sorted(groups[entry])
        if len(nums) == 1:
            parts.append(f"{prefix}{nums[0]:0{width}d}")
            continue
        parts.append(f"{prefix}[{','.join(_ranges(nums, width))}]")
    return ",".join(parts)


def _ranges(nums: list[int], width: int) -> list[str]:
    """Sorted numbers as ``lo-hi`` runs, each end padded to ``width``."""
    runs: list[str] = []
    start = prev = nums[0]
    for n in [*nums[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        lo, hi = f"{start:0{width}d}", f"{prev:0{width}d}"
        runs.append(lo if start == prev else f"{lo}-{hi}")
        if n is not None:
            start = prev = n
    return runs

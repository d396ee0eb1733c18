"""Host lists: ``gpu[01-04,07],login1`` (Slurm's hostlist syntax) to a list of names."""

from __future__ import annotations

import re

from gpufleet.errors import UsageError

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth != 0:
        raise UsageError(f"host list {text!r}: unbalanced brackets")
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def expand_hostlist(text: str) -> list[str]:
    """Expand one bracket group per name (as Slurm writes node lists), keeping zero padding."""
    out: list[str] = []
    for item in _split_top(text):
        m = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", item)
        if not m:
            out.append(item)
            continue
        prefix, body, suffix = m.groups()
        for rng in body.split(","):
            r = _RANGE.match(rng.strip())
            if not r:
                raise UsageError(f"host list {text!r}: bad range {rng!r}")
            lo, hi = r.group(1), r.group(2) or r.group(1)
            if int(hi) < int(lo):
                raise UsageError(f"host list {text!r}: range {rng!r} goes backwards")
            for i in range(int(lo), int(hi) + 1):
                out.append(f"{prefix}{i:0{len(lo)}d}{suffix}")
    if len(set(out)) != len(out):
        raise UsageError(f"host list {text!r}: a host appears twice")
    return out

"""A small Dockerfile reader for the tests: instructions with line continuations joined,
comments dropped, split into build stages."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Stage:
    """One ``FROM`` and the instructions after it."""

    base: str
    name: str | None
    steps: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.steps if o == op]


def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order (Dockerfile reference: ``\\`` continues a line,
    ``#`` at the start of a line is a comment)."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        op, _, arg = buf.partition(" ")
        out.append((op.upper(), arg.strip()))
        buf = ""
    return out


def stages(text: str) -> tuple[dict[str, str], list[Stage]]:
    """The global ``ARG`` defaults (before the first ``FROM``) and the stages."""
    args: dict[str, str] = {}
    result: list[Stage] = []
    for op, arg in instructions(text):
        if op == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", arg, re.IGNORECASE)
            assert m, arg
            result.append(Stage(m.group(1), m.group(2)))
        elif result:
            result[-1].steps.append((op, arg))
        elif op == "ARG":
            name, _, default = arg.partition("=")
            args[name] = default
    return args, result


def arg_defaults(stage: Stage) -> dict[str, str]:
    out = {}
    for arg in stage.all("ARG"):
        name, _, default = arg.partition("=")
        out[name] = default.strip('"')
    return out

"""validate's pass lines do not come from the simulator: no module under gpufleet.validate
imports gpufleet.devices.sim (read from the source with ast, so lazy imports inside functions
count too)."""

from __future__ import annotations

import ast
from pathlib import Path

import gpufleet

SRC = Path(gpufleet.__file__).parent


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            out.append((node.lineno, "." * node.level + (node.module or "")))
    return out


def _offending(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    files = sorted((SRC / package).rglob("*.py"))
    assert files, package
    for path in files:
        for line, name in _imports(path):
            if name.startswith("."):
                found.append(f"{path.relative_to(SRC)}:{line}: relative import {name}")
            elif any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(SRC)}:{line}: {name}")
    return found


def test_validate_imports_nothing_from_the_simulator() -> None:
    assert _offending("validate", ("gpufleet.devices.sim",)) == []


def test_validate_imports_nothing_from_the_control_plane() -> None:
    assert _offending("validate", ("gpufleet.control", "gpufleet.cli")) == []


def test_the_catalog_imports_nothing_above_it() -> None:
    above = tuple(
        f"gpufleet.{p}"
        for p in (
            *("devices", "telemetry", "health", "validate", "plan"),
            *("schedulers", "agent", "control", "cli", "web"),
        )
    )
    assert _offending("catalog", above) == []


def test_the_checker_sees_a_lazy_import(tmp_path: Path) -> None:
    """The reader finds an import hidden inside a function (as thresholds.py had one)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from gpufleet.devices.sim.physics import X\n    return X\n")
    assert (2, "gpufleet.devices.sim.physics") in _imports(f)

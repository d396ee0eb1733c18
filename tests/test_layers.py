"""The layer rules of docs/architecture.md, checked by reading every module's imports.

Every ``import`` statement under ``src/gpufleet`` counts, at module level, inside functions and
under ``if TYPE_CHECKING:`` alike: a lazy import is still a dependency. ``RULES`` is the one table
of what each package may import; each rule is its own test, and a failure lists every offending
line (file, line number, the import, the rule and why it exists).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpufleet"

#: Every layer above the device layer (devices must not reach up into any of them).
ABOVE_DEVICES = frozenset(
    {
        "telemetry",
        "health",
        "validate",
        "plan",
        "mig",
        "schedulers",
        "agent",
        "control",
        "web",
        "testing",
        "cli",
        "facade",
        "client",
    }
)


@dataclass(frozen=True)
class Rule:
    """What the modules of one package may import from gpufleet.

    ``only``: an allow-list (the package itself is always allowed); ``never``: forbidden
    packages or modules (``devices.sim`` forbids that module and everything under it);
    ``exempt``: importers the rule does not apply to (only for the ``*`` rule).
    """

    why: str
    only: frozenset[str] | None = None
    never: frozenset[str] = frozenset()
    exempt: frozenset[str] = frozenset()


RULES: dict[str, Rule] = {
    "catalog": Rule(
        "facts as data: the bottom layer knows nothing of the code above it",
        only=frozenset({"errors"}),
    ),
    "wire": Rule(
        "the messages between agent, control plane and CLI sit below both",
        only=frozenset({"catalog", "errors", "jsonable"}),
    ),
    "devices": Rule("the device layer knows nothing of services above it", never=ABOVE_DEVICES),
    "control": Rule(
        "the control plane holds no CLI, no simulator and no client of itself",
        never=frozenset({"cli", "devices.sim", "client", "facade"}),
    ),
    "agent": Rule(
        "the node agent talks to the control plane over the wire, never by importing it",
        never=frozenset({"control", "client", "facade"}),
    ),
    "validate": Rule(
        "pass lines come from the catalog, not from the simulator they judge",
        never=frozenset({"devices.sim"}),
    ),
    "*": Rule(
        "rigs stay out of production code; only the entry point imports the CLI",
        never=frozenset({"testing", "cli"}),
        exempt=frozenset({"__main__"}),
    ),
}


@dataclass(frozen=True)
class Import:
    """One import of a gpufleet module: where it is written and what it names."""

    source: Path
    line: int
    importer: str  # dotted module name without the "gpufleet." prefix
    target: str  # idem; "" is the gpufleet package itself


def module_name(path: Path, root: Path = SRC) -> str:
    """``src/gpufleet/control/api/app.py`` -> ``control.api.app``; a package's ``__init__`` -> its
    name."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(dotted: str, root: Path) -> bool:
    base = root.joinpath(*dotted.split(".")) if dotted else root
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path, root: Path = SRC) -> Iterator[Import]:
    """Every gpufleet import in one file (absolute or relative, at any depth)."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "gpufleet" or alias.name.startswith("gpufleet."):
                    yield Import(path, node.lineno, me, alias.name.removeprefix("gpufleet")[1:])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                base_parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            elif node.module == "gpufleet" or (node.module or "").startswith("gpufleet."):
                base = (node.module or "").removeprefix("gpufleet").removeprefix(".")
            else:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                target = sub if _is_module(sub, root) else base
                yield Import(path, node.lineno, me, target)


def all_imports(root: Path = SRC) -> list[Import]:
    """Every gpufleet import under ``root``, once per (file, line, target)."""
    found = (imp for path in sorted(root.rglob("*.py")) for imp in imports_of(path, root))
    return list(dict.fromkeys(found))


def package_of(module: str) -> str:
    return module.split(".")[0] if module else "gpufleet"


def _matches(target: str, names: frozenset[str]) -> bool:
    return any(target == n or target.startswith(n + ".") for n in names)


def violations(rule_key: str, imports: list[Import]) -> list[str]:
    """Each import that breaks ``RULES[rule_key]``, as one readable line."""
    rule = RULES[rule_key]
    out = []
    for imp in imports:
        src_pkg, dst_pkg = package_of(imp.importer), package_of(imp.target)
        applies = rule_key == "*" or src_pkg == rule_key
        if not applies or src_pkg in rule.exempt or src_pkg == dst_pkg:
            continue
        bad = _matches(imp.target, rule.never) or (
            rule.only is not None and dst_pkg not in rule.only
        )
        if bad:
            where = imp.source.relative_to(SRC.parent)
            out.append(
                f"{where}:{imp.line}: {imp.importer or 'gpufleet'} imports gpufleet."
                f"{imp.target} (rule {rule_key!r}: {rule.why})"
            )
    return out


def package_graph(imports: list[Import]) -> dict[str, dict[str, Import]]:
    """Package -> the packages it imports (with one example import for each edge)."""
    graph: dict[str, dict[str, Import]] = {}
    for imp in imports:
        a, b = package_of(imp.importer), package_of(imp.target)
        graph.setdefault(a, {})
        if a != b:
            graph[a].setdefault(b, imp)
    return graph


def find_cycle(graph: dict[str, dict[str, Import]]) -> list[str] | None:
    """One cycle of the graph (its nodes in order, first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


IMPORTS = all_imports()


@pytest.mark.parametrize("rule_key", list(RULES))
def test_layer_rule(rule_key: str) -> None:
    found = violations(rule_key, IMPORTS)
    for line in found:
        print(line)
    assert not found, f"{len(found)} import(s) break rule {rule_key!r}:\n" + "\n".join(found)


def test_no_import_cycle_between_packages() -> None:
    cycle = find_cycle(package_graph(IMPORTS))
    if cycle is None:
        return
    graph = package_graph(IMPORTS)
    steps = []
    for a, b in itertools.pairwise(cycle):
        imp = graph[a][b]
        steps.append(f"  {a} -> {b}: {imp.source.relative_to(SRC.parent)}:{imp.line}")
    pytest.fail("import cycle between packages:\n" + "\n".join(steps))


def test_reader_sees_lazy_relative_and_submodule_imports(tmp_path: Path) -> None:
    """The reader is not blind: function-level, relative and ``from pkg import module`` forms."""
    root = tmp_path / "gpufleet"
    (root / "control").mkdir(parents=True)
    (root / "devices" / "sim").mkdir(parents=True)
    for f in ("__init__.py", "errors.py", "control/__init__.py", "devices/__init__.py"):
        (root / f).write_text("", encoding="utf-8")
    (root / "devices" / "sim" / "__init__.py").write_text("", encoding="utf-8")
    mod = root / "control" / "fleet.py"
    mod.write_text(
        "from ..errors import UsageError\n"
        "def later():\n"
        "    from gpufleet.devices import sim\n"
        "    import gpufleet.cli.app\n"
        "    from . import other\n",
        encoding="utf-8",
    )
    found = sorted((i.line, i.target) for i in imports_of(mod, root))
    assert found == [(1, "errors"), (3, "devices.sim"), (4, "cli.app"), (5, "control")]
    imports = list(imports_of(mod, root))
    graph = package_graph(imports)
    assert set(graph["control"]) == {"errors", "devices", "cli"}


def test_cycle_finder_reports_a_cycle() -> None:
    imp = Import(SRC / "x.py", 1, "a", "b")
    assert find_cycle({"a": {"b": imp}, "b": {"c": imp}, "c": {"a": imp}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": imp}, "b": {}, "c": {"b": imp}}) is None


def test_architecture_doc_lists_every_rule() -> None:
    """docs/architecture.md states the same rules as RULES (a rule added here is documented)."""
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    rules_section = doc.split("## Rules the layer test enforces", 1)[1].split("\n## ", 1)[0]
    for key, rule in RULES.items():
        if key == "*":
            assert "every package (but `__main__`)" in rules_section
            continue
        row = next((ln for ln in rules_section.splitlines() if ln.startswith(f"| `{key}` |")), "")
        assert row, f"docs/architecture.md has no row for rule {key!r}"
        for name in sorted(rule.never | (rule.only or frozenset())):
            assert f"`{name}`" in row, f"rule {key!r}: {name} missing from the doc's row"

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
        "simvalidate",
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
        never=frozenset({"devices.sim", "simvalidate"}),
    ),
    "simvalidate": Rule(
        "the simulator's validation engine joins validate and the simulator, nothing above",
        only=frozenset({"validate", "devices", "catalog", "errors", "jsonable"}),
    ),
    "*": Rule(
        "rigs stay out of production code; only the entry point imports the CLI",
        never=frozenset({"testing", "cli"}),
        exempt=frozenset({"__main__"}),
    ),
}


#: The control plane's wings: one sub-package per concern above the kernel (docs/architecture.md,
#: "Inside the control plane").
CONTROL_WINGS = frozenset(
    {"fleet", "series", "ingest", "ha", "campaigns", "power", "energy", "jobs", "notify"}
)


@dataclass(frozen=True)
class RoomRule:
    """What the modules of one room of ``control`` may import of the other rooms.

    ``only``: an allow-list of rooms (the room itself is always allowed); ``never``: forbidden
    rooms. The key ``wing`` stands for every room of `CONTROL_WINGS`."""

    why: str
    only: frozenset[str] | None = None
    never: frozenset[str] = frozenset()


ROOM_RULES: dict[str, RoomRule] = {
    "state": RoomRule(
        "the kernel knows no wing: it reaches scheduling, batch writes and notifications only "
        "through its ports (control/state/ports.py), handed in by the composition root",
        only=frozenset({"db"}),
    ),
    "db": RoomRule("the database sits below the kernel", only=frozenset()),
    "wing": RoomRule(
        "a wing builds on the kernel and the database, never on another wing, on HTTP or on "
        "the composition root",
        only=frozenset({"state", "db"}),
    ),
    "api": RoomRule(
        "HTTP only: it calls wings and the kernel; `gpufleet up` sits above it",
        never=frozenset({"up"}),
    ),
    "service": RoomRule(
        "the composition root builds the kernel and the wings; the API is built on it, never by it",
        never=frozenset({"api", "up"}),
    ),
}


@dataclass(frozen=True)
class Import:
    """One import of a gpufleet module: where it is written and what it names."""

    source: Path
    line: int
    importer: str  # dotted module name without the "gpufleet." prefix
    target: str  # idem; "" is the gpufleet package itself
    # executed at run time (at import or when a function runs), not only under
    # ``if TYPE_CHECKING:``: the edges of the run-time import graph
    runtime: bool = True


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


def _statements(tree: ast.Module) -> Iterator[tuple[ast.stmt, bool]]:
    """Every statement with whether it can run (False: only under ``if TYPE_CHECKING:``)."""

    def walk(body: list[ast.stmt], runtime: bool) -> Iterator[tuple[ast.stmt, bool]]:
        for node in body:
            yield node, runtime
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from walk(node.body, False)
                yield from walk(node.orelse, runtime)
            else:
                for name in ("body", "orelse", "finalbody"):
                    inner = getattr(node, name, None)
                    if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                        yield from walk(inner, runtime)
                for handler in getattr(node, "handlers", []) or []:
                    yield from walk(handler.body, runtime)

    yield from walk(tree.body, True)


def imports_of(path: Path, root: Path = SRC) -> Iterator[Import]:
    """Every gpufleet import in one file (absolute or relative, at any depth)."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node, runtime in _statements(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "gpufleet" or alias.name.startswith("gpufleet."):
                    target = alias.name.removeprefix("gpufleet")[1:]
                    yield Import(path, node.lineno, me, target, runtime)
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
                yield Import(path, node.lineno, me, target, runtime)


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


def room_of(module: str) -> str | None:
    """``control.state.store`` -> ``state``; ``control.service`` -> ``service``; ``control`` ->
    ``control``; None outside the control plane."""
    parts = module.split(".")
    if parts[0] != "control":
        return None
    return parts[1] if len(parts) > 1 else "control"


def room_violations(rule_key: str, imports: list[Import]) -> list[str]:
    """Each import between rooms of ``control`` that breaks ``ROOM_RULES[rule_key]``."""
    rule = ROOM_RULES[rule_key]
    rooms = CONTROL_WINGS if rule_key == "wing" else frozenset({rule_key})
    out = []
    for imp in imports:
        src, dst = room_of(imp.importer), room_of(imp.target)
        if src not in rooms or dst is None or dst in (src, "control"):
            continue
        if dst in rule.never or (rule.only is not None and dst not in rule.only):
            where = imp.source.relative_to(SRC.parent)
            out.append(
                f"{where}:{imp.line}: {imp.importer} imports gpufleet.{imp.target} "
                f"(room rule {rule_key!r}: {rule.why})"
            )
    return out


@pytest.mark.parametrize("rule_key", list(ROOM_RULES))
def test_control_room_rule(rule_key: str) -> None:
    found = room_violations(rule_key, IMPORTS)
    assert not found, f"{len(found)} import(s) break room rule {rule_key!r}:\n" + "\n".join(found)


#: names through which code outside the kernel holds the store
STORE_NAMES = frozenset({"store", "st"})


def private_store_uses(path: Path, root: Path = SRC) -> list[str]:
    """``store._name`` (or ``x.store._name``) in one file: the kernel's private parts."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__"):
            continue
        base = node.value
        held = (isinstance(base, ast.Name) and base.id in STORE_NAMES) or (
            isinstance(base, ast.Attribute) and base.attr in STORE_NAMES
        )
        if held:
            out.append(f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_nothing_outside_the_kernel_uses_the_stores_private_parts() -> None:
    kernel = SRC / "control" / "state"
    found = [
        line
        for path in sorted(SRC.rglob("*.py"))
        if kernel not in path.parents
        for line in private_store_uses(path)
    ]
    assert not found, "the store's private parts used outside control/state:\n" + "\n".join(found)


def module_graph(imports: list[Import]) -> dict[str, dict[str, Import]]:
    """Module -> the modules it imports at run time (``if TYPE_CHECKING:`` imports left out)."""
    graph: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if imp.runtime and imp.importer != imp.target:
            graph.setdefault(imp.importer, {}).setdefault(imp.target, imp)
    return graph


def test_no_run_time_import_cycle_between_modules() -> None:
    """No two modules import each other at run time, through any chain (a lazy import inside a
    function counts: it runs; one under ``if TYPE_CHECKING:`` does not)."""
    graph = module_graph(IMPORTS)
    cycle = find_cycle(graph)
    if cycle is None:
        return
    steps = [
        f"  {a} -> {b}: {graph[a][b].source.relative_to(SRC.parent)}:{graph[a][b].line}"
        for a, b in itertools.pairwise(cycle)
    ]
    pytest.fail("run-time import cycle:\n" + "\n".join(steps))


# -- each rule shown failing on a planted violation ---------------------------------------------

#: rule -> (importer, target) that breaks it
PLANTED: dict[str, tuple[str, str]] = {
    "catalog": ("catalog.planted", "devices"),
    "wire": ("wire.planted", "control.state.store"),
    "devices": ("devices.planted", "health"),
    "control": ("control.fleet.planted", "devices.sim"),
    "agent": ("agent.planted", "control.state.store"),
    "validate": ("validate.planted", "devices.sim.fleet"),
    "simvalidate": ("simvalidate.planted", "control.state.store"),
    "*": ("health.planted", "testing.procs"),
}
PLANTED_ROOMS: dict[str, tuple[str, str]] = {
    "state": ("control.state.planted", "control.ingest.writes"),
    "db": ("control.db.planted", "control.state.store"),
    "wing": ("control.series.planted", "control.fleet.queries"),
    "api": ("control.api.planted", "control.up"),
    "service": ("control.service", "control.api.app"),
}


def test_every_rule_has_a_planted_violation() -> None:
    assert set(PLANTED) == set(RULES) and set(PLANTED_ROOMS) == set(ROOM_RULES)


@pytest.mark.parametrize("rule_key", list(RULES))
def test_a_planted_import_breaks_the_rule(rule_key: str) -> None:
    importer, target = PLANTED[rule_key]
    planted = Import(SRC / "planted.py", 1, importer, target)
    assert violations(rule_key, [*IMPORTS, planted]) == [
        f"gpufleet/planted.py:1: {importer} imports gpufleet.{target} "
        f"(rule {rule_key!r}: {RULES[rule_key].why})"
    ]


@pytest.mark.parametrize("rule_key", list(ROOM_RULES))
def test_a_planted_import_breaks_the_room_rule(rule_key: str) -> None:
    importer, target = PLANTED_ROOMS[rule_key]
    planted = Import(SRC / "planted.py", 1, importer, target)
    assert room_violations(rule_key, [*IMPORTS, planted]) == [
        f"gpufleet/planted.py:1: {importer} imports gpufleet.{target} "
        f"(room rule {rule_key!r}: {ROOM_RULES[rule_key].why})"
    ]


def test_a_planted_private_store_use_is_found(tmp_path: Path) -> None:
    planted = tmp_path / "gpufleet" / "control" / "fleet" / "planted.py"
    planted.parent.mkdir(parents=True)
    src = (
        "def f(store, svc):\n"
        "    store._move(1)\n"  # found
        "    svc.store._bump()\n"  # found
        "    store.bump()\n"  # public
        "    store.__class__\n"  # dunder
        "    other._move(2)\n"  # not the store
    )
    planted.write_text(src, encoding="utf-8")
    found = private_store_uses(planted, tmp_path / "gpufleet")
    where = "gpufleet/control/fleet/planted.py"
    assert found == [f"{where}:2: store._move", f"{where}:3: svc.store._bump"]


def test_a_planted_run_time_cycle_is_found_and_a_typing_one_is_not(tmp_path: Path) -> None:
    root = tmp_path / "gpufleet"
    (root / "pkg").mkdir(parents=True)
    for f in ("__init__.py", "pkg/__init__.py"):
        (root / f).write_text("", encoding="utf-8")
    (root / "pkg" / "a.py").write_text("from gpufleet.pkg import b\n", encoding="utf-8")
    (root / "pkg" / "b.py").write_text(
        "def later():\n    from gpufleet.pkg import a\n", encoding="utf-8"
    )
    (root / "pkg" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpufleet.pkg import d\n",
        encoding="utf-8",
    )
    (root / "pkg" / "d.py").write_text("from gpufleet.pkg import c\n", encoding="utf-8")
    graph = module_graph(all_imports(root))
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    del graph["pkg.a"]
    assert find_cycle(graph) is None  # c -> d only under TYPE_CHECKING


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


def _doc_section(title: str) -> str:
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    return doc.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_architecture_doc_names_every_control_module() -> None:
    """The control plane's picture in docs/architecture.md names every room and module."""
    import re

    section = _doc_section("Inside the control plane")
    words = set(re.findall(r"[A-Za-z_]+", section))
    control = SRC / "control"
    missing = []
    for path in sorted(control.rglob("*.py")):
        rel = path.relative_to(control)
        if "migrations" in rel.parts or path.name == "__init__.py":
            continue
        if path.stem not in words or (len(rel.parts) > 1 and f"{rel.parts[0]}/" not in section):
            missing.append(str(rel))
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_architecture_doc_lists_every_room_rule() -> None:
    section = _doc_section("Inside the control plane")
    for key, rule in ROOM_RULES.items():
        first = "every wing" if key == "wing" else f"`{key}`"
        row = next((ln for ln in section.splitlines() if ln.startswith(f"| {first}")), "")
        assert row, f"docs/architecture.md has no row for room rule {key!r}"
        for name in sorted(rule.never | (rule.only or frozenset())):
            assert f"`{name}`" in row, f"room rule {key!r}: {name} missing from the doc's row"
        if key == "wing":
            assert all(f"`{w}`" in row for w in CONTROL_WINGS)


def test_the_recipes_point_at_files_that_exist() -> None:
    import re

    section = _doc_section("Recipes")
    paths = re.findall(r"`([a-z_/]+\.py)`", section)
    assert len(paths) >= 5
    roots = [SRC, SRC / "control", SRC.parents[1]]
    missing = [p for p in paths if not any((r / p).is_file() for r in roots)]
    assert not missing, f"docs/architecture.md's recipes name files that do not exist: {missing}"

"""The longest-first file order (`tests.file_order`) and the script that records file times
(`scripts/test-durations.py`)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.file_order import UNKNOWN_PROCESS_S, load_weights, order_by_weight

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class FakeItem:
    nodeid: str
    keywords: dict[str, Any] = field(default_factory=dict)


def _ids(items: list[Any]) -> list[str]:
    return [i.nodeid for i in items]


def test_files_run_heaviest_first_each_in_its_own_order() -> None:
    items: list[Any] = [
        FakeItem("tests/a.py::t1"),
        FakeItem("tests/a.py::t2"),
        FakeItem("tests/b.py::t1"),
        FakeItem("tests/c.py::t1"),
        FakeItem("tests/c.py::t2"),
    ]
    order_by_weight(items, {"tests/a.py": 1.0, "tests/b.py": 30.0, "tests/c.py": 5.0})
    assert _ids(items) == [
        "tests/b.py::t1",
        "tests/c.py::t1",
        "tests/c.py::t2",
        "tests/a.py::t1",
        "tests/a.py::t2",
    ]


def test_an_unrecorded_file_weighs_by_its_marks() -> None:
    items: list[Any] = [
        FakeItem("tests/fast_new.py::t"),
        FakeItem("tests/known.py::t"),
        FakeItem("tests/proc_new.py::t", {"process": True}),
    ]
    order_by_weight(items, {"tests/known.py": UNKNOWN_PROCESS_S / 2})
    assert _ids(items) == ["tests/proc_new.py::t", "tests/known.py::t", "tests/fast_new.py::t"]


def test_a_missing_or_broken_record_gives_no_weights(tmp_path: Path) -> None:
    assert load_weights(tmp_path / "absent.json") == {}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert load_weights(bad) == {}
    bad.write_text(json.dumps({"files": ["a"]}))
    assert load_weights(bad) == {}
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"files": {"tests/x.py": 3, "tests/y.py": "n/a"}}))
    assert load_weights(good) == {"tests/x.py": 3.0}


def _script() -> Any:
    spec = importlib.util.spec_from_file_location(
        "test_durations", ROOT / "scripts/test-durations.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_record_sums_each_files_cases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _script()
    assert mod.file_of("tests.test_file_order") == "tests/test_file_order.py"
    assert mod.file_of("tests.test_file_order.TestSomething") == "tests/test_file_order.py"
    assert mod.file_of("tests.no_such_module") is None
    report = tmp_path / "r.xml"
    report.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.test_file_order" name="a" time="1.25"/>'
        '<testcase classname="tests.test_file_order" name="b" time="2.5"/>'
        '<testcase classname="tests.conftest" name="c" time="4"/>'
        '<testcase classname="elsewhere.mod" name="d" time="9"/>'
        "</testsuite></testsuites>"
    )
    out = tmp_path / "durations.json"
    monkeypatch.setattr(mod, "OUT", out)
    monkeypatch.setattr(mod, "ROOT", ROOT)
    assert mod.main([str(report)]) == 0
    assert load_weights(out) == {"tests/conftest.py": 4.0, "tests/test_file_order.py": 3.75}
    report.write_text("<testsuites")
    assert mod.main([str(report)]) == 1


def _make_test_flags() -> list[str]:
    """The flags `make test` gives pytest after ``-n $(TEST_WORKERS)``, from the Makefile."""
    recipe = (ROOT / "Makefile").read_text(encoding="utf-8")
    line = next(x for x in recipe.splitlines() if "$(PYTEST)" in x and "--dist loadfile" in x)
    flags = line.split("-n $(TEST_WORKERS)", 1)[1].split(";", 1)[0].split()
    return [f for f in flags if not f.startswith("--durations")]


@pytest.mark.process  # a pytest of its own, with an xdist worker
def test_make_tests_scheduler_keeps_the_longest_first_order(tmp_path: Path) -> None:
    """xdist's ``--dist loadfile`` reorders files by their number of tests unless told not to
    (pytest-xdist >= 3.7, ``--loadscope-reorder`` on by default): the one-test chaos files,
    the suite's longest, then ran last, alone. With `make test`'s flags, a planted one-test file
    ordered first (as `order_by_weight` would) runs before a three-test file."""
    import subprocess
    import sys

    (tmp_path / "test_few.py").write_text("def test_long():\n    pass\n", encoding="utf-8")
    (tmp_path / "test_many.py").write_text(
        "".join(f"def test_{i}():\n    pass\n" for i in range(3)), encoding="utf-8"
    )
    (tmp_path / "conftest.py").write_text(
        "def pytest_collection_modifyitems(items):\n"
        "    items.sort(key=lambda i: 'test_few' not in i.nodeid)\n"
        "def pytest_runtest_call(item):\n"
        "    with open('order.txt', 'a') as f:\n"
        "        f.write(item.nodeid + '\\n')\n",
        encoding="utf-8",
    )
    flags = _make_test_flags()
    assert "--dist" in flags, flags
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "xdist.plugin",
            "-q",
            "-n",
            "1",
            "-p",
            "no:cacheprovider",
            *flags,
            "-c",
            "/dev/null",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    ran = (tmp_path / "order.txt").read_text(encoding="utf-8").split()
    assert ran[0].endswith("test_few.py::test_long"), ran

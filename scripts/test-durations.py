#!/usr/bin/env python3
"""Write ``tests/durations.json`` (each test file's seconds in one full run) from a JUnit XML
report, for `tests/file_order.py`'s longest-first order:

    .venv/bin/pytest ... --junitxml=/tmp/report.xml
    .venv/bin/python scripts/test-durations.py /tmp/report.xml

A test's time in the report is its setup, call and teardown together (pytest's default
``junit_duration_report``)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "durations.json"


def file_of(classname: str) -> str | None:
    """``tests.integration.test_x[.TestY]`` -> ``tests/integration/test_x.py`` (the longest
    dotted prefix that is a file under the project)."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        path = Path(*parts[:n]).with_suffix(".py")
        if (ROOT / path).is_file():
            return path.as_posix()
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        tree = ET.parse(argv[0])
    except (OSError, ET.ParseError) as exc:
        print(f"{argv[0]}: not a readable JUnit XML report: {exc}", file=sys.stderr)
        return 1
    files: dict[str, float] = {}
    for case in tree.iter("testcase"):
        name = file_of(case.get("classname", ""))
        if name is not None:
            files[name] = files.get(name, 0.0) + float(case.get("time") or 0.0)
    if not files:
        print(f"{argv[0]}: no test cases with a known file", file=sys.stderr)
        return 1
    doc = {
        "about": "seconds per test file in one full run; written by scripts/test-durations.py",
        "files": {k: round(v, 2) for k, v in sorted(files.items(), key=lambda kv: -kv[1])},
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"{OUT}: {len(files)} files, {sum(files.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

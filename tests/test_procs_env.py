"""The process rigs (`gpufleet.testing.procs`) start children that import the same gpufleet as
the process that starts them, from a work tree or from an installed package alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.testing import procs


def test_a_source_tree_goes_first_on_the_childs_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(procs, "package_root", lambda: tmp_path / "src")
    monkeypatch.setattr(procs, "_installed_roots", lambda: {tmp_path / "site-packages"})
    env = procs.child_env({"PYTHONPATH": "/elsewhere", "HOME": "/h"})
    assert env["PYTHONPATH"] == f"{tmp_path / 'src'}:/elsewhere" and env["HOME"] == "/h"


def test_an_installed_package_needs_no_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(procs, "package_root", lambda: tmp_path / "site-packages")
    monkeypatch.setattr(procs, "_installed_roots", lambda: {tmp_path / "site-packages"})
    assert "PYTHONPATH" not in procs.child_env({"HOME": "/h"})


def test_the_root_is_where_this_process_found_gpufleet() -> None:
    import gpufleet

    root = procs.package_root()
    assert (root / "gpufleet" / "__init__.py").resolve() == Path(gpufleet.__file__).resolve()

"""Shared fixtures; `gpu`-marked tests skip cleanly where NVML finds no GPU; the tier guard
(`tests.tiers`), the Hypothesis profile (`tests.hypothesis_budget`) and the longest-first file
order (`tests.file_order`) are loaded here."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.hypothesis_budget  # noqa: F401  (registers and loads the Hypothesis profile)
from tests.file_order import load_weights, order_by_weight
from tests.tiers import (
    mark_by_fixtures,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    pytest_runtest_teardown,
)

__all__ = ["pytest_runtest_makereport", "pytest_runtest_protocol", "pytest_runtest_teardown"]

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "nvidia-h200"


@functools.cache
def real_gpu_available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount()) > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


# pytest-xdist's workers get COLUMNS=80 and LINES=24 in their environment; Rich reads COLUMNS
# once, when the CLI's console is made, which would fix every table at 80 columns whatever a
# test asks for. The CLI tests set COLUMNS per invocation, as a serial run leaves them free to.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


# The simulator's update states (`gpufleet.devices.sim.state`) of this run go to a temporary
# directory, not the user's ~/.local/state; the processes the tests start inherit it.
if "GPUFLEET_SIM_STATE_DIR" not in os.environ:
    import tempfile

    os.environ["GPUFLEET_SIM_STATE_DIR"] = tempfile.mkdtemp(prefix="gpufleet-sim-state-")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_by_fixtures(items)
    order_by_weight(items, load_weights())  # longest files first: the workers end together
    if real_gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (NVML found none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def h200_dir() -> Path:
    return H200


def tolerant_parse(parse: Callable[..., Any], tries: int = 3) -> Callable[..., Any]:
    """``parse`` retried on SystemError, then a SyntaxError (see `_tolerate_ast_depth_mismatch`)."""

    def tolerant(*args: Any, **kwargs: Any) -> Any:
        for _ in range(tries):
            try:
                return parse(*args, **kwargs)
            except SystemError:
                continue
        raise SyntaxError("source not shown: CPython's AST recursion depth mismatch")

    tolerant.tolerant = True  # type: ignore[attr-defined]
    return tolerant


def _tolerate_ast_depth_mismatch() -> None:
    """CPython 3.11's ``ast.parse`` can raise ``SystemError: AST constructor recursion depth
    mismatch`` while other threads run (python/cpython#106905, pytest-dev/pytest#10763). pytest
    parses a failing test's source to print it; that SystemError turned one test's failure into
    an INTERNALERROR that ended the whole xdist run, hiding the failure itself. Retry the parse,
    then fall back to printing the failing line alone (pytest's path for unparsable source)."""
    from _pytest._code import code

    parse = getattr(code, "getstatementrange_ast")  # noqa: B009  (not re-exported for mypy)
    if not getattr(parse, "tolerant", False):
        setattr(code, "getstatementrange_ast", tolerant_parse(parse))  # noqa: B010


def retrying_on_ast_race(fn: Callable[..., Any], tries: int = 3) -> Callable[..., Any]:
    """``fn`` called again when CPython's spurious AST SystemError interrupts it (a race with
    another thread's parse: the next call sees a quiet counter); any other error, or the same
    one ``tries`` times, goes through."""

    def retrying(*args: Any, **kwargs: Any) -> Any:
        for attempt in range(tries):
            try:
                return fn(*args, **kwargs)
            except SystemError as exc:
                if "recursion depth mismatch" not in str(exc) or attempt == tries - 1:
                    raise
        raise AssertionError("unreachable")

    retrying.tolerant = True  # type: ignore[attr-defined]
    return retrying


def _tolerate_ast_race_in_imports() -> None:
    """The same SystemError on an import: pytest rewrites the asserts of every package that
    ships a pytest plugin (anyio, schemathesis, ...) as it is imported, with ``ast.parse``. anyio
    imports its submodules lazily, so a server thread of a test (uvicorn serving a static file)
    imported one and the parse raced the main thread's: the file was never served and two
    dashboard tests failed. Import anyio's lazy names now, on the main thread, and retry a
    rewrite the race interrupted."""
    import importlib

    from _pytest.assertion import rewrite

    rewrite_test = getattr(rewrite, "_rewrite_test")  # noqa: B009  (private to pytest)
    if not getattr(rewrite_test, "tolerant", False):
        setattr(rewrite, "_rewrite_test", retrying_on_ast_race(rewrite_test))  # noqa: B010
    for name in ("anyio", "anyio.abc", "anyio.streams", "anyio.lowlevel"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        for attr in dir(mod):
            try:
                getattr(mod, attr)
            except Exception:
                continue


_tolerate_ast_depth_mismatch()
_tolerate_ast_race_in_imports()


# `gpufleet.control.service.CONTROL_THREAD` (not imported here: collection stays cheap;
# tests/test_leak_guard.py holds the two equal)
CONTROL_THREAD = "gpufleet-control"


@pytest.fixture(scope="module", autouse=True)
def _no_controller_left_running() -> Iterator[None]:
    """A module that starts a controller service stops it: one left running ticks in its
    xdist worker for the worker's whole life and starves the tests after it of CPU (the
    schemathesis module's did, in every worker that collected it). Checked after the module's
    own fixtures are torn down; a service that is stopping gets a few seconds."""
    before = {t.ident for t in threading.enumerate() if t.name == CONTROL_THREAD}
    yield
    deadline = time.monotonic() + 5.0
    while True:
        left = [
            t
            for t in threading.enumerate()
            if t.name == CONTROL_THREAD and t.ident not in before and t.is_alive()
        ]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if left:
        pytest.fail(
            f"{len(left)} controller service(s) started by this module still run after it: "
            "stop every ControlService a test or fixture starts",
            pytrace=False,
        )

"""The figures guard's planted regressions (``benchmarks/guard.py --plant KIND``): proof that the
guard bites, without touching ``src/``.

The guard's children get the ``sitecustomize.py`` that `write_plant` writes first on their
``PYTHONPATH`` (chaining any other one), which for ``cli-start`` burns 5x the CPU a gpufleet
CLI interpreter used when it exits (a regression in what every command pays), and for
``validate`` wraps
``gpufleet.validate.runner.run_suite`` to burn 5x the CPU each run took. Anything else (this
module's code run in pytest, say) burns nothing and hooks nothing.
"""

from __future__ import annotations

from pathlib import Path

PLANTS = ("cli-start", "validate")


class GuardError(Exception):
    """Bad usage or a bad budgets file: one line, exit 2."""


PLANT_SOURCE = '''"""Planted by benchmarks/guard.py --plant {kind!r}: a regression to catch."""
import os
import sys
import time

KIND = {kind!r}


def _burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _is_gpufleet_cli():
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\\0") if a]
    except OSError:
        argv = list(sys.argv)
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1] == "gpufleet":
        return True
    return len(argv) > 1 and os.path.basename(argv[1]) == "gpufleet"


def _wrap_runner(module):
    import functools

    original = module.run_suite

    @functools.wraps(original)
    def run_suite(*args, **kwargs):
        t0 = time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            _burn(5 * (time.process_time() - t0))

    module.run_suite = run_suite


class _RunnerFinder:
    """Wraps gpufleet.validate.runner once it is imported."""

    name = "gpufleet.validate.runner"

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap_runner(module)

        spec.loader.exec_module = exec_and_wrap
        return spec


def _chain():
    """Run the sitecustomize this one hides, if any."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if _is_gpufleet_cli():
    if KIND == "cli-start":
        import atexit

        atexit.register(lambda: _burn(5 * time.process_time()))
    elif KIND == "validate":
        sys.meta_path.insert(0, _RunnerFinder())
_chain()
'''


def write_plant(directory: Path, kind: str) -> Path:
    """A directory holding the planted ``sitecustomize.py`` for ``kind``."""
    if kind not in PLANTS:
        raise GuardError(f"--plant: unknown kind {kind!r} (known: {', '.join(PLANTS)})")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(PLANT_SOURCE.format(kind=kind), encoding="utf-8")
    return directory

"""The one registry of validation engines: name -> a factory of an `Engine` (the runner's
protocol, `gpufleet.validate.runner.Engine`). ``torch`` (real GPUs through PyTorch) is
registered here; ``sim`` (simulated time on a simulated fleet) by `gpufleet.simvalidate` when
it is imported, so this package never imports the simulator. A new engine registers itself
the same way and is opened by name (`open_engine`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet.errors import UsageError
from gpufleet.validate.runner import Engine

EngineFactory = Callable[..., Engine]
_ENGINES: dict[str, EngineFactory] = {}


def register_engine(name: str, factory: EngineFactory) -> None:
    """Make ``factory`` the engine called ``name`` (once per name)."""
    if _ENGINES.get(name, factory) is not factory:
        raise ValueError(f"validation engine {name!r} registered twice")
    _ENGINES[name] = factory


def engine_names() -> list[str]:
    return sorted(_ENGINES)


def open_engine(name: str, **options: Any) -> Engine:
    """The engine ``name`` built with ``options`` (the factory's own arguments)."""
    factory = _ENGINES.get(name)
    if factory is None:
        raise UsageError(
            f"validation engine {name!r} is not registered (known: {', '.join(engine_names())})",
            hint="the simulator's engine registers when gpufleet.simvalidate is imported",
        )
    return factory(**options)


def _torch(**options: Any) -> Engine:
    from gpufleet.validate.engine_torch import TorchEngine

    return TorchEngine.open(**options)


register_engine("torch", _torch)

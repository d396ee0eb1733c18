"""Option groups: options several commands share, declared once as a function's parameters."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, get_type_hints

R = TypeVar("R")


def option_groups(
    **builders: Callable[..., Any],
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Give a command the options of each builder, in place of its parameter of that name.

    A builder is a function whose parameters are typer options (``x: T = typer.Option(...)``).
    ``@option_groups(remote=job_remote)`` on ``def cancel(job_id: str = ..., *, remote: Remote)``
    declares ``job_remote``'s options on ``cancel`` where ``remote`` stands (so ``--help`` lists
    them there) and calls ``cancel(job_id=..., remote=job_remote(**their values))``. A builder
    should only gather the values: a check there would run before the command's own checks,
    and on a group's callback even when a subcommand runs instead.
    """

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        signature = inspect.signature(command, eval_str=True)
        hints = {k: v for k, v in get_type_hints(command).items() if k not in builders}
        params: list[inspect.Parameter] = []
        groups: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {}
        for p in signature.parameters.values():
            build = builders.get(p.name)
            if build is None:
                params.append(p)
                continue
            options = inspect.signature(build, eval_str=True).parameters.values()
            params += [o.replace(kind=p.kind) for o in options]
            hints.update({o.name: o.annotation for o in options})
            groups[p.name] = (build, tuple(o.name for o in options))
        if missing := set(builders) - set(groups):
            raise TypeError(f"{command.__name__} has no parameter {', '.join(sorted(missing))}")

        @functools.wraps(command)
        def run(**values: Any) -> R:
            for name, (build, options) in groups.items():
                values[name] = build(**{o: values.pop(o) for o in options})
            return command(**values)

        run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = hints
        return run

    return decorate

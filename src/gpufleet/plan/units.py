"""The planner's unit layer: Pint quantities parsed from spec strings like ``"40 kW"``.

Spec figures carry their unit explicitly (``"0.08 USD/kWh"``, ``"208 V"``); this module checks the
dimension and converts to the planner's canonical unit, so the model only sees plain floats
(watts, volts, amperes, USD, USD/kWh, USD/hour, seconds, bytes, bytes/s). The registry is built
lazily: importing the planner does not pay Pint's start-up cost until a spec is parsed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

__all__ = ["DIMENSIONS", "UnitProblem", "parse_quantity"]


class UnitProblem(ValueError):
    """A value is not a quantity of the expected kind; the message says what was given."""


@dataclass(frozen=True)
class Dimension:
    """One kind of quantity the spec accepts: its Pint dimensionality and canonical unit."""

    name: str
    pint_dims: str
    canonical: str
    example: str
    data: bool = False  # Pint treats bytes as dimensionless; require a byte/bit unit by name


_LABELS = {
    "power": "a power",
    "voltage": "a voltage",
    "current": "a current",
    "money": "an amount of money",
    "energy_price": "an energy price",
    "hourly_price": "a price per hour",
    "yearly_price": "a price per year",
    "monthly_price": "a price per month",
    "time": "a duration",
    "size": "a data size",
    "bandwidth": "a bandwidth",
    "length": "a length",
}

DIMENSIONS: dict[str, Dimension] = {
    d.name: d
    for d in (
        Dimension("power", "[power]", "W", "40 kW"),
        Dimension("voltage", "[electric_potential]", "V", "208 V"),
        Dimension("current", "[current]", "A", "30 A"),
        Dimension("money", "[currency]", "USD", "250000 USD"),
        Dimension("energy_price", "[currency] / [energy]", "USD/kWh", "0.08 USD/kWh"),
        Dimension("hourly_price", "[currency] / [time]", "USD/hour", "2.50 USD/hour"),
        Dimension("yearly_price", "[currency] / [time]", "USD/year", "20000 USD/year"),
        Dimension("monthly_price", "[currency] / [time]", "USD/month", "1500 USD/month"),
        Dimension("time", "[time]", "s", "5 min"),
        Dimension("size", "", "B", "30 TB", data=True),
        Dimension("bandwidth", "1 / [time]", "B/s", "10 GB/s", data=True),
        Dimension("length", "[length]", "m", "3 m"),
    )
}


@functools.cache
def _registry() -> Any:
    import pint

    ureg: Any = pint.UnitRegistry()
    ureg.define("USD = [currency] = usd = dollar")
    ureg.define("kUSD = 1000 USD")
    ureg.define("MUSD = 1000000 USD")
    return ureg


def _normalise(text: str) -> str:
    # Prices per GPU-hour are written "USD/GPU/hour" or "USD/GPU-hour": the per-GPU is in the
    # field name, so it is dropped here. "$" is accepted as USD.
    t = text.strip().replace("$", " USD ")
    for token in ("/GPU-hour", "/gpu-hour", "/GPU-h", "/gpu-h"):
        t = t.replace(token, "/hour")
    for token in ("/GPU", "/gpu"):
        t = t.replace(token, "")
    return " ".join(t.split())


def parse_quantity(value: object, dimension: str) -> float:
    """Parse ``value`` (a string with a unit) as ``dimension``; return it in the canonical unit.

    A bare number is refused: every figure in a spec names its unit.
    """
    dim = DIMENSIONS[dimension]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise UnitProblem(
            f"{value!r} is not {_LABELS[dim.name]} (write it with a unit, e.g. {dim.example!r})"
        )
    if isinstance(value, int | float):
        raise UnitProblem(f"{value!r} has no unit; write it with one, e.g. {dim.example!r}")
    import pint

    ureg = _registry()
    try:
        q = ureg.Quantity(_normalise(value))
    except (pint.errors.PintError, ValueError, AttributeError, TypeError, SyntaxError) as exc:
        raise UnitProblem(f"{value!r} is not {_LABELS[dim.name]} (e.g. {dim.example!r})") from exc
    ok = isinstance(q, ureg.Quantity) and q.check(dim.pint_dims or "[]")
    if ok and dim.data:
        ok = any(u in str(q.units) for u in ("byte", "bit"))
    if not ok:
        raise UnitProblem(f"{value!r} is not {_LABELS[dim.name]} (e.g. {dim.example!r})")
    magnitude = float(q.to(dim.canonical).magnitude)
    if magnitude != magnitude or magnitude < 0:
        raise UnitProblem(f"{value!r} must not be negative")
    return magnitude

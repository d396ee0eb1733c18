"""Value parsing shared by the nvidia-smi parsers: "not available" spellings, numbers with units,
switches (Enabled/Disabled, Yes/No, Active/Not Active) and small formats (``16x``, ``0x1F``).

Every parser raises :class:`gpufleet.errors.ParseError` naming the source and the place (element
path, line and column); a bad value never escapes as a ``ValueError``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpufleet.errors import ParseError

# How nvidia-smi spells "no value": N/A, [N/A], Not Supported, [Not Supported], the deprecation
# notice (e.g. display_mode on driver 580, see tests/fixtures/nvidia-h200/nvidia-smi-q.xml),
# "Unknown Error" / "Insufficient Permissions" answers, and empty text.
NOT_AVAILABLE = frozenset(
    s.lower()
    for s in (
        "",
        "N/A",
        "Not Supported",
        "Requested functionality has been deprecated",
        "Unknown Error",
        "Insufficient Permissions",
        "Not Available",
        "Not Found",
        "None",
    )
)

# A number, optionally followed by a unit (``143771 MiB``, ``79.60 W``, ``-2 C``, ``0 %``).
_NUMBER = re.compile(r"^([-+]?\d+(?:\.\d+)?)(?:\s*([A-Za-z%/()]+))?$")

_TRUE = frozenset({"enabled", "yes", "active", "on", "supported", "true", "1"})
_FALSE = frozenset({"disabled", "no", "not active", "off", "false", "0"})


class Where:
    """The source and place of one value, for error messages."""

    __slots__ = ("place", "source")

    def __init__(self, source: str, place: str) -> None:
        self.source = source
        self.place = place

    def error(self, problem: str) -> ParseError:
        return ParseError(self.source, self.place, problem)


def clean(text: str | None) -> str | None:
    """Stripped text, or ``None`` for every "not available" spelling (brackets allowed)."""
    if text is None:
        return None
    s = " ".join(text.split())
    inner = s[1:-1].strip() if s.startswith("[") and s.endswith("]") else s
    if inner.lower() in NOT_AVAILABLE:
        return None
    return s


def number(text: str | None, where: Where, units: Iterable[str] = ()) -> float | None:
    """A number with an optional unit; ``units`` lists the accepted ones (any when empty).

    ``None`` for the not-available spellings; ParseError for anything else that is not a number.
    """
    s = clean(text)
    if s is None:
        return None
    m = _NUMBER.match(s)
    if m is None:
        raise where.error(f"{s!r} is not a number")
    allowed = tuple(units)
    unit = m.group(2)
    if unit is not None and allowed and unit not in allowed:
        raise where.error(f"{s!r}: unit {unit!r} is not one of {', '.join(allowed)}")
    return float(m.group(1))


def integer(text: str | None, where: Where, units: Iterable[str] = ()) -> int | None:
    """Like :func:`number`, for whole numbers (``3201 MHz``); ``1.5`` is an error."""
    value = number(text, where, units)
    if value is None:
        return None
    if not value.is_integer():
        raise where.error(f"{clean(text)!r} is not a whole number")
    return int(value)


def switch(text: str | None, where: Where) -> bool | None:
    """Enabled/Disabled, Yes/No, Active/Not Active, On/Off -> bool."""
    s = clean(text)
    if s is None:
        return None
    low = s.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise where.error(f"{s!r} is not one of Enabled/Disabled, Yes/No, Active/Not Active")


def link_width(text: str | None, where: Where) -> int | None:
    """PCIe link width: ``16x`` (XML), ``x16`` or ``16`` (CSV) -> 16."""
    s = clean(text)
    if s is None:
        return None
    digits = s.lower().removesuffix("x").removeprefix("x").strip()
    if not digits.isdigit():
        raise where.error(f"{s!r} is not a PCIe link width like 16x")
    return int(digits)


def hex_mask(text: str | None, where: Where) -> int | None:
    """A hexadecimal bitmask such as ``0x0000000000000001``."""
    s = clean(text)
    if s is None:
        return None
    try:
        return int(s, 16)
    except ValueError:
        raise where.error(f"{s!r} is not a hexadecimal bitmask") from None


def pci_device_id(text: str | None) -> str | None:
    """``233510DE`` (XML) or ``0x233510DE`` (CSV) -> ``0x233510DE``, the catalog's spelling."""
    s = clean(text)
    if s is None:
        return None
    body = s[2:] if s.lower().startswith("0x") else s
    return "0x" + body.upper()


MIB = 2**20

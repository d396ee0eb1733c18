"""Plain JSON values from gpufleet's records (dataclasses, pydantic models, enums, paths).

The one NaN-to-null cleaner: NaN and the infinities are not JSON (PostgreSQL's JSON columns
reject them, browsers' ``JSON.parse`` too), so they become ``None``. The CLI's ``--json``, the
validation report and the control plane's JSON columns all go through :func:`to_jsonable`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, pydantic models, enums, paths, tuples and sets to plain JSON values;
    NaN and infinities to ``None``."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "model_dump"):
        return to_jsonable(obj.model_dump(mode="json"))
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float):
        return finite_or_none(obj)
    return obj


def finite_or_none(value: float) -> float | None:
    """A float as JSON allows it: NaN and infinities become ``None``."""
    return value if math.isfinite(value) else None

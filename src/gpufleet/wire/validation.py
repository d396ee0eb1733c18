"""Validation results as they travel: the result a node (or an operator) posts to the control
plane, which moves the node out of ``validating``."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from gpufleet.wire.limits import NodeName, NoNul

Verdict = Literal["pass", "warn", "fail"]


class ValidationPost(BaseModel):
    """``POST /api/v1/validation-results``: a `gpufleet validate` result for one node. Its
    minimal shape is ``{"node", "verdict"}``; other fields (the whole report, say) are kept as
    posted."""

    model_config = ConfigDict(extra="allow")

    node: NodeName
    verdict: Verdict
    summary: NoNul | None = Field(None, max_length=2000)

    @model_validator(mode="after")
    def _finite_extras(self) -> ValidationPost:
        """Extra fields are kept as posted, so they must be valid JSON: no NaN or infinity
        (a body's ``NaN`` or ``1e309``) anywhere inside them."""
        todo: list[tuple[str, Any]] = list((self.model_extra or {}).items())
        while todo:
            where, value = todo.pop()
            if isinstance(value, float) and not math.isfinite(value):
                raise PydanticCustomError(
                    "finite_number",
                    "{where}: must be a finite number, not {value}",
                    {"where": where, "value": repr(value)},
                )
            if isinstance(value, dict):
                todo.extend((f"{where}.{k}", v) for k, v in value.items())
            elif isinstance(value, list):
                todo.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
        return self

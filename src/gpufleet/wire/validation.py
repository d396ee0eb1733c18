"""Validation results as they travel: the result a node (or an operator) posts to the control
plane, which moves the node out of ``validating``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

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

"""The one NaN-to-null cleaner (gpufleet.jsonable) and the writers that use it: the CLI's
--json, the validation report and the control plane's JSON columns."""

from __future__ import annotations

import dataclasses
import json
import math
from enum import StrEnum
from pathlib import Path

import pytest
from pydantic import BaseModel

from gpufleet.control.db.engine import json_serializer
from gpufleet.jsonable import finite_or_none, to_jsonable
from gpufleet.validate.results import Metric, Status, TestResult, ValidationReport

BAD = [math.nan, math.inf, -math.inf]


class Colour(StrEnum):
    RED = "red"


@dataclasses.dataclass(frozen=True)
class Reading:
    value: float
    where: Path
    tags: tuple[str, ...]
    colour: Colour


class Record(BaseModel):
    value: float


@pytest.mark.parametrize("bad", BAD)
def test_nan_and_infinities_become_null_everywhere_in_a_record(bad: float) -> None:
    doc = {
        "top": bad,
        "list": [1.5, bad],
        "nested": {"r": Reading(bad, Path("/x"), ("a",), Colour.RED)},
        "set": frozenset([bad]),
        "model": Record(value=bad),
    }
    out = to_jsonable(doc)
    assert out["top"] is None and out["list"] == [1.5, None]
    assert out["nested"]["r"] == {"value": None, "where": "/x", "tags": ["a"], "colour": "red"}
    assert out["set"] == [None] and out["model"] == {"value": None}
    json.dumps(out, allow_nan=False)  # strict JSON: raises on any NaN or infinity left


def test_finite_values_pass_unchanged() -> None:
    assert finite_or_none(0.0) == 0.0 and finite_or_none(-2.5) == -2.5
    assert [finite_or_none(b) for b in BAD] == [None, None, None]
    assert to_jsonable({"a": 1, "b": True, "c": None, "d": "x"}) == {
        "a": 1,
        "b": True,
        "c": None,
        "d": "x",
    }


def test_database_json_columns_use_it() -> None:
    assert json.loads(json_serializer({"a": [math.inf, 2.0], "b": Colour.RED})) == {
        "a": [None, 2.0],
        "b": "red",
    }


def test_validation_report_uses_it() -> None:
    metric = Metric("bf16", math.nan, "TFLOP/s", math.inf, None, Status.FAIL)
    result = TestResult("matmul", "n1", Status.FAIL, "no figure", gpu=0, metrics=[metric])
    report = ValidationReport(engine="sim", level=1, tests=["matmul"], started_s=0.0)
    report.results.append(result)
    doc = json.loads(report.to_json())
    got = doc["results"][0]["metrics"][0]
    assert got["value"] is None and got["expected"] is None

"""What an agent reports of its GPUs: device records, columnar samples and device events."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from gpufleet.wire.limits import (
    FIELD_NAME_PATTERN,
    MAX_FIELD_NAME,
    MAX_FIELDS_PER_BLOCK,
    MAX_SAMPLES_PER_BLOCK,
    MAX_UUID,
    WIRE_CONFIG,
    FiniteNumber,
    GpuIndex,
    NoNul,
)

FieldName = Annotated[str, Field(max_length=MAX_FIELD_NAME, pattern=FIELD_NAME_PATTERN)]
Uuid = Annotated[NoNul, Field(strict=True, min_length=1, max_length=MAX_UUID)]


class WireDevice(BaseModel):
    """A GPU's identity and configuration: `gpufleet.devices.types.DeviceInfo` as a mapping."""

    model_config = WIRE_CONFIG

    index: GpuIndex
    uuid: Uuid
    info: dict[str, Any]


class WireSamples(BaseModel):
    """Samples of one GPU, columnar: ``fields[name][i]`` was read at ``t[i]`` (null: no reading).

    Every column holds exactly ``len(t)`` values; times and readings are finite numbers."""

    model_config = WIRE_CONFIG

    gpu_uuid: Uuid
    gpu_index: GpuIndex
    t: list[FiniteNumber] = Field(max_length=MAX_SAMPLES_PER_BLOCK)
    fields: dict[FieldName, list[FiniteNumber | None]] = Field(max_length=MAX_FIELDS_PER_BLOCK)

    @field_validator("fields")
    @classmethod
    def _one_value_per_time(
        cls, fields: dict[str, list[float | None]], info: ValidationInfo
    ) -> dict[str, list[float | None]]:
        t = info.data.get("t")
        if t is not None:
            for name, col in fields.items():
                if len(col) != len(t):
                    raise PydanticCustomError(
                        "column_length",
                        "must hold {times} values, one per time in t; it holds {values}",
                        {"column": name, "times": len(t), "values": len(col)},
                    )
        return fields


class WireEvent(BaseModel):
    """A `gpufleet.devices.types.GpuEvent` on the wire."""

    model_config = WIRE_CONFIG

    gpu_index: GpuIndex
    gpu_uuid: str | None = Field(None, max_length=MAX_UUID)
    kind: str = Field(max_length=64)
    timestamp_s: FiniteNumber
    xid: int | None = None
    detail: str = Field("", max_length=4000)

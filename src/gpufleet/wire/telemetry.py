"""What an agent reports of its GPUs: device records, columnar samples and device events, and
which samples and events a control plane keeps (`screen_samples`, `screen_events`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from gpufleet.wire.limits import (
    EVENT_FIELD,
    FIELD_NAME_PATTERN,
    MAX_FIELD_NAME,
    MAX_FIELDS_PER_BLOCK,
    MAX_SAMPLES_PER_BLOCK,
    MAX_UUID,
    SAMPLE_AHEAD_S,
    SAMPLE_BEHIND_S,
    SAMPLE_RANGES,
    TIME_FIELD,
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


class WireHost(BaseModel):
    """The node's CPUs and memory as Slurm's ``NodeName`` line counts them
    (`gpufleet.devices.host.HostTopology`); ``None``: could not be read."""

    model_config = WIRE_CONFIG

    cpus: int | None = Field(None, ge=1, le=1 << 20)
    boards: int | None = Field(None, ge=1, le=1024)
    sockets_per_board: int | None = Field(None, ge=1, le=1024)
    cores_per_socket: int | None = Field(None, ge=1, le=1 << 16)
    threads_per_core: int | None = Field(None, ge=1, le=64)
    memory_mb: int | None = Field(None, ge=1, le=1 << 40)
    cpu_model: str | None = Field(None, max_length=256)


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


def _count(dropped: dict[str, int], key: str, n: int = 1) -> None:
    if n:
        dropped[key] = dropped.get(key, 0) + n


def screen_samples(
    samples: Sequence[WireSamples], now_s: float
) -> tuple[list[WireSamples], dict[str, int]]:
    """The samples a control plane keeps at ``now_s``, and what it dropped, counted by field:
    a sample whose time is outside ``now_s - SAMPLE_BEHIND_S .. now_s + SAMPLE_AHEAD_S``
    (under ``"t"``, its readings uncounted), a reading outside its field's `SAMPLE_RANGES`
    (the rest of its sample stays). The reference for the ingest path's array version
    (`gpufleet.control.ingest.screen`), which must agree with it."""
    lo, hi = now_s - SAMPLE_BEHIND_S, now_s + SAMPLE_AHEAD_S
    dropped: dict[str, int] = {}
    out = []
    for s in samples:
        keep = [i for i, t in enumerate(s.t) if lo <= float(t) <= hi]
        _count(dropped, TIME_FIELD, len(s.t) - len(keep))
        fields: dict[str, list[float | None]] = {}
        for name, col in s.fields.items():
            vals = [col[i] for i in keep]
            rng = SAMPLE_RANGES.get(name)
            if rng is not None:
                bad = [j for j, v in enumerate(vals) if v is not None and not in_range(v, rng)]
                for j in bad:
                    vals[j] = None
                _count(dropped, name, len(bad))
            fields[name] = vals
        t = [s.t[i] for i in keep]
        out.append(
            WireSamples.model_construct(
                gpu_uuid=s.gpu_uuid, gpu_index=s.gpu_index, t=t, fields=fields
            )
        )
    return out, dropped


def in_range(value: float, rng: tuple[float, float]) -> bool:
    """Whether a reading lies within ``rng`` (compared as the float64 the store keeps)."""
    v = float(value)
    return rng[0] <= v <= rng[1]


def screen_events(
    events: Sequence[WireEvent], now_s: float, dropped: dict[str, int]
) -> list[WireEvent]:
    """The device events whose time is inside the same window as samples' (the others counted
    in ``dropped`` under ``"events"``)."""
    lo, hi = now_s - SAMPLE_BEHIND_S, now_s + SAMPLE_AHEAD_S
    kept = [e for e in events if lo <= float(e.timestamp_s) <= hi]
    _count(dropped, EVENT_FIELD, len(events) - len(kept))
    return kept

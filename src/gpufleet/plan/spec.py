"""The planner's input: a YAML spec validated by pydantic, every figure with an explicit unit.

Figures that are not plain counts carry their unit in the value (``rack_power: "40 kW"``) or in the
field name (``target_days``, ``horizon_years``). ``load_spec`` turns any problem into one
:class:`~gpufleet.errors.ParseError` naming the field path (``constraints.rack_power: '40 kV' is
not a power``), its line when the spec came as text, and, for misspelt keys, a did-you-mean
(``gpufleet.yamldoc``, shared with every other YAML file gpufleet reads).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from gpufleet.errors import ParseError
from gpufleet.plan.units import parse_quantity
from gpufleet.yamldoc import Document, read_yaml, validate

__all__ = [
    "BYTES_PER_VALUE",
    "Constraints",
    "GpuCountWorkload",
    "HpcWorkload",
    "InferenceWorkload",
    "ModelShape",
    "PlanSpec",
    "Prices",
    "StorageSpec",
    "TrainingWorkload",
    "load_spec",
]

# Bytes per value at each numeric precision (IEEE 754 / OCP MX formats: fp8 1 byte, fp4 half).
BYTES_PER_VALUE: dict[str, float] = {
    "fp64": 8.0,
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "fp4": 0.5,
    "int8": 1.0,
    "int4": 0.5,
}
# Precisions for tensor-core compute (catalog ``tflops`` keys); int8/int4 weights use fp8/fp4 peaks.
ComputePrecision = Literal["tf32", "bf16", "fp16", "fp8", "fp4"]
StoragePrecision = Literal["fp32", "bf16", "fp16", "fp8", "fp4", "int8", "int4"]


def _unit(dimension: str) -> BeforeValidator:
    return BeforeValidator(lambda v: parse_quantity(v, dimension))


Power = Annotated[float, _unit("power")]  # watts
Voltage = Annotated[float, _unit("voltage")]  # volts
Current = Annotated[float, _unit("current")]  # amperes
Money = Annotated[float, _unit("money")]  # USD
EnergyPrice = Annotated[float, _unit("energy_price")]  # USD per kWh
HourlyPrice = Annotated[float, _unit("hourly_price")]  # USD per hour
YearlyPrice = Annotated[float, _unit("yearly_price")]  # USD per year
MonthlyPrice = Annotated[float, _unit("monthly_price")]  # USD per month
Duration = Annotated[float, _unit("time")]  # seconds
Size = Annotated[float, _unit("size")]  # bytes
Length = Annotated[float, _unit("length")]  # metres
Auto = Literal["auto"]


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelShape(_Spec):
    """A transformer: its parameter count, its architecture, or both.

    With only ``parameters``, the planner derives a nominal architecture (stated in the plan).
    """

    parameters: float | None = Field(default=None, gt=0)
    layers: int | None = Field(default=None, gt=0)
    hidden_size: int | None = Field(default=None, gt=0)
    heads: int | None = Field(default=None, gt=0)
    kv_heads: int | None = Field(default=None, gt=0)
    vocab_size: int | None = Field(default=None, gt=0)
    ffn_hidden_size: int | None = Field(default=None, gt=0)
    gated_mlp: bool = False
    tied_embeddings: bool = True

    @model_validator(mode="after")
    def _enough(self) -> ModelShape:
        arch = (self.layers, self.hidden_size, self.heads)
        if self.parameters is None and None in arch:
            raise ValueError("give parameters, or layers + hidden_size + heads (or both)")
        if any(a is not None for a in arch) and None in arch:
            raise ValueError("an architecture needs all of layers, hidden_size and heads")
        if self.heads and self.hidden_size and self.hidden_size % self.heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of heads {self.heads}"
            )
        if self.kv_heads and self.heads and self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        return self


class TrainingWorkload(_Spec):
    """Pre-training or fine-tuning a transformer with mixed-precision Adam."""

    kind: Literal["training"]
    name: str = "training"
    model: ModelShape
    sequence_length: int = Field(gt=0)
    global_batch: int = Field(gt=0, description="sequences per optimizer step")
    micro_batch: int = Field(default=1, gt=0)
    tokens: float = Field(gt=0, description="tokens to train on")
    precision: ComputePrecision = "bf16"
    optimizer: Literal["adam", "adamw"] = "adam"
    zero_stage: Literal[0, 1, 2, 3] = 1
    tensor_parallel: int | Auto = "auto"
    pipeline_parallel: int | Auto = "auto"
    data_parallel: int | Auto = "auto"
    sequence_parallel: bool = True
    recompute: Literal["none", "selective", "full"] = "selective"
    target_days: float | None = Field(default=None, gt=0)
    mfu: float = Field(default=0.40, gt=0, le=1)
    gpus: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _degrees(self) -> TrainingWorkload:
        for name in ("tensor_parallel", "pipeline_parallel", "data_parallel"):
            v = getattr(self, name)
            if isinstance(v, int) and v < 1:
                raise ValueError(f"{name} must be 'auto' or a positive integer, not {v}")
        return self


class InferenceWorkload(_Spec):
    """Serving a transformer: decode bounded by memory bandwidth, prefill by compute."""

    kind: Literal["inference"]
    name: str = "inference"
    model: ModelShape
    weights_precision: StoragePrecision = "fp8"
    kv_cache_precision: StoragePrecision = "fp8"
    context_length: int = Field(gt=0, description="tokens held per sequence (prompt + output)")
    concurrent_sequences: int = Field(gt=0)
    target_tokens_per_s: float = Field(gt=0, description="generated tokens per second, fleet-wide")
    mfu: float = Field(default=0.40, gt=0, le=1)
    bandwidth_efficiency: float = Field(default=0.70, gt=0, le=1)
    tensor_parallel: int | Auto = "auto"


class HpcWorkload(_Spec):
    """HPC or rendering: sized by a sustained FP64/FP32 FLOP rate and the working set in memory.

    Give the rate (``sustained_tflops``, fleet-wide) or the work (``flops`` with ``target_days``),
    and the working set as ``memory`` (bytes) or ``values`` (numbers held, times 8 bytes at fp64,
    4 at fp32). ``efficiency`` is sustained / peak (default 0.6, HPL-class dense kernels).
    """

    kind: Literal["hpc"]
    name: str = "hpc"
    precision: Literal["fp64", "fp32"] = "fp64"
    tensor_cores: bool = True
    sustained_tflops: float | None = Field(default=None, gt=0)
    flops: float | None = Field(default=None, gt=0)
    target_days: float | None = Field(default=None, gt=0)
    efficiency: float = Field(default=0.60, gt=0, le=1)
    memory: Size | None = None
    values: float | None = Field(default=None, gt=0)
    gpus: int | None = Field(default=None, gt=0)
    # Input read from shared storage at the start of a run (a simulation's mesh and initial or
    # restart state, a render's scene and textures); default: the working set (memory/values).
    dataset: Size | None = None
    dataset_per_node: bool = Field(
        default=False,
        description="every node reads the whole dataset (a render node loads the whole scene) "
        "instead of its share (a simulation rank reads its partition)",
    )
    read_time: Duration = Field(default=300.0, gt=0, description="time to read the dataset")
    coupled: bool = Field(
        default=True,
        description="ranks exchange data between nodes every step (MPI: CFD, molecular "
        "dynamics); false for independent tasks (render frames, sweeps): no compute fabric",
    )

    @model_validator(mode="after")
    def _enough(self) -> HpcWorkload:
        if self.flops is not None and self.target_days is None and self.gpus is None:
            raise ValueError("flops needs target_days (or gpus) to size a fleet")
        given = (self.sustained_tflops, self.flops, self.gpus, self.memory, self.values)
        if all(g is None for g in given):
            raise ValueError("give sustained_tflops, flops + target_days, memory/values or gpus")
        if self.memory is not None and self.values is not None:
            raise ValueError("give memory or values, not both")
        return self


class GpuCountWorkload(_Spec):
    """A plain number of GPUs (capacity someone already sized)."""

    kind: Literal["gpus"]
    name: str = "capacity"
    gpus: int = Field(gt=0)


Workload = Annotated[
    TrainingWorkload | InferenceWorkload | HpcWorkload | GpuCountWorkload,
    Field(discriminator="kind"),
]


class Circuit(_Spec):
    """One branch circuit feeding a rack PDU."""

    voltage: Voltage = 208.0
    current: Current = 60.0
    phases: Literal[1, 3] = 3


class Constraints(_Spec):
    """Facility and network limits. ``None`` means "use the default for the cooling type"."""

    rack_power: Power | None = None
    # None follows each candidate system's catalog cooling (generic servers: air); a choice
    # against a catalog system's cooling is planned as asked and warned (plan/planner.py).
    cooling: Literal["air", "liquid"] | None = None
    pue: float | None = Field(default=None, ge=1.0, le=3.0)
    circuit: Circuit = Circuit()
    redundancy: Literal["N", "N+1", "2N"] = "N+1"
    racks_available: int | None = Field(default=None, gt=0)
    budget: Money | None = None
    rack_units: int = Field(default=42, gt=0)
    reserved_rack_units: int = Field(default=4, ge=0)
    generic_host_overhead: Power = 3000.0
    memory_headroom: float = Field(default=0.10, ge=0, lt=1)
    switch_radix: int = Field(default=64, ge=4)
    switch_port_gbps: int = Field(default=400, gt=0)
    switch_power: Power = 1500.0
    gpus_per_server: int | None = Field(default=None, ge=1, le=8)
    management_nodes_per_su: int = Field(default=0, ge=0, le=64)
    # Compute-fabric (InfiniBand) ports the management nodes (UFM appliances) take, in total;
    # "auto" follows the NVIDIA DGX SuperPOD RA (4 when management nodes are planned), 0 keeps
    # them off the compute fabric (plan/fabric.py, RA_UFM_COMPUTE_LINKS).
    management_compute_links: int | Auto = "auto"
    scalable_unit: int = Field(default=32, ge=1, description="compute nodes per SU")
    management_node_power: Power = 1000.0
    pilot_host_overhead: Power = 1000.0
    ups_runtime: Duration = 300.0
    ups_battery: Literal["li-ion", "vrla"] = "li-ion"
    # None sizes each genset from the load: the smallest standard standby rating (plan/plant.py)
    generator_size: Power | None = None
    generator_loading: float = Field(default=0.8, gt=0, le=1, description="of standby rating")
    liquid_fraction: float = Field(default=0.80, ge=0, le=1)
    cdu_capacity: Power = 1_000_000.0
    coolant_delta_t: float = Field(default=10.0, gt=0, le=40, description="kelvin")
    air_delta_t: float = Field(default=12.0, gt=0, le=40, description="kelvin")
    racks_per_row: int = Field(default=12, gt=0)
    rack_width: Length = 0.6
    row_pitch: Length = 2.4
    # Rack footprint depth, empty enclosure weight and the floor's distributed load rating
    # (plan/facility.py: APC NetShelter SX AR3300 600 x 1200 mm, 134.09 kg; ANSI/TIA-942 12 kPa)
    rack_depth: Length = 1.2
    rack_tare_kg: float = Field(default=134.09, ge=0)
    floor_rating_kg_m2: float = Field(default=1224.0, gt=0)

    @model_validator(mode="after")
    def _radix(self) -> Constraints:
        if self.switch_radix % 2:
            raise ValueError(f"switch_radix must be even, not {self.switch_radix}")
        if self.reserved_rack_units >= self.rack_units:
            raise ValueError("reserved_rack_units leaves no space for servers")
        links = self.management_compute_links
        if isinstance(links, int) and not 0 <= links <= 256:
            raise ValueError(f"management_compute_links must be 'auto' or 0-256, not {links}")
        return self


PerCandidate = Money | dict[str, Money]


class Prices(_Spec):
    """What things cost. Missing prices leave that part of the cost out (the plan says so)."""

    server: PerCandidate | None = None
    gpu: PerCandidate | None = None
    energy: EnergyPrice | None = None
    cloud_per_gpu_hour: HourlyPrice | None = None
    support_per_year: YearlyPrice | None = None
    support_percent_of_capex: float | None = Field(default=None, ge=0, le=100)
    space_per_rack_month: MonthlyPrice | None = None
    switch: Money | None = None
    transceiver: Money | None = None
    utilization: float = Field(default=0.80, gt=0, le=1)
    staff_fte: float = Field(default=0.0, ge=0)
    staff_cost_per_fte: YearlyPrice | None = None
    depreciation_years: float | None = Field(default=None, gt=0, le=30)
    residual_percent: float = Field(default=0.0, ge=0, le=100)
    pfs_per_tb: Money | None = None

    @model_validator(mode="after")
    def _staff(self) -> Prices:
        if self.staff_fte and self.staff_cost_per_fte is None:
            raise ValueError("staff_fte needs staff_cost_per_fte (e.g. '150000 USD/year')")
        return self


class StorageSpec(_Spec):
    """Checkpoint and dataset I/O targets."""

    checkpoint_time: Duration = 300.0
    dataset_bytes_per_token: float = Field(default=4.0, gt=0)
    checkpoints_kept: int = Field(default=3, ge=1)
    dataset: Size | None = None


class PlanSpec(_Spec):
    """The whole spec: what to run, on which candidates, under which limits and prices."""

    name: str = "plan"
    horizon_years: float = Field(default=4.0, gt=0, le=30)
    candidates: list[str] = Field(min_length=1)
    workloads: list[Workload] = Field(min_length=1)
    constraints: Constraints = Constraints()
    prices: Prices = Prices()
    storage: StorageSpec = StorageSpec()


_WORKLOAD_TAGS = {"workloads": ("training", "inference", "hpc", "gpus")}


def load_spec(source: str | dict[str, Any], name: str = "spec") -> PlanSpec:
    """Validate a spec given as YAML text or an already-parsed mapping; no file I/O here."""
    doc = read_yaml(source, name) if isinstance(source, str) else Document(source, name)
    if not isinstance(doc.data, dict):
        raise ParseError(name, "(top level)", "expected a mapping with candidates and workloads")
    return validate(PlanSpec, doc, union_tags=_WORKLOAD_TAGS)

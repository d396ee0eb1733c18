"""Typed records of the catalog: GPU models, systems, MIG geometries, XID codes, performance.

Every figure comes from a data file under ``catalog/data`` and carries a source: a record's
``source`` covers all its figures unless ``sources`` names a more specific one for a field.
Throughput figures are dense (vendor "with sparsity" numbers divided by 2), in TFLOP/s.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PRECISIONS = ("fp64", "fp64_tensor", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
Precision = Literal["fp64", "fp64_tensor", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4"]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Tflops(_Record):
    """Dense peak TFLOP/s per precision; ``None`` where the GPU has no such path."""

    fp64: float | None = None
    fp64_tensor: float | None = None
    fp32: float | None = None
    tf32: float | None = None
    bf16: float | None = None
    fp16: float | None = None
    fp8: float | None = None
    fp4: float | None = None

    def get(self, precision: str) -> float | None:
        if precision not in PRECISIONS:
            raise KeyError(precision)
        value: float | None = getattr(self, precision)
        return value


class Efficiency(_Record):
    """What a healthy GPU really reaches (measured), used by validation and the simulator.

    ``tflops`` holds achieved dense TFLOP/s per precision for short matmuls; bandwidths in GB/s.
    """

    tflops: dict[str, float] = Field(default_factory=dict)
    sustained_bf16_tflops: float | None = None
    sustained_sm_clock_mhz: float | None = None  # SM clock during that sustained load
    hbm_copy_gbps: float | None = None
    pcie_h2d_gbps: float | None = None
    pcie_d2h_gbps: float | None = None
    source: str


class GpuLinkKind(StrEnum):
    NVLINK = "nvlink"
    BRIDGE = "bridge"
    INFINITY_FABRIC = "infinity_fabric"
    NONE = "none"


class GpuModel(_Record):
    """One GPU model (SKU) and its data-sheet figures."""

    key: str
    marketing_name: str
    vendor: Literal["nvidia", "amd"] = "nvidia"
    aliases: tuple[str, ...] = ()
    nvml_names: tuple[str, ...] = ()
    pci_device_ids: tuple[str, ...] = ()
    architecture: str
    compute_capability: str | None = None
    form_factor: Literal["sxm", "pcie", "nvl", "superchip", "oam"]
    memory_bytes: int
    memory_type: str
    memory_bandwidth_gbps: float
    tflops: Tflops
    max_power_w: float
    power_limit_min_w: float | None = None
    power_limit_max_w: float | None = None
    idle_power_w: float | None = None
    gpu_link: GpuLinkKind
    nvlink_generation: int | None = None
    gpu_link_bandwidth_gbps: float | None = None
    pcie_generation: int
    pcie_lanes: int = 16
    mig_max_instances: int = 0
    sm_count: int | None = None
    max_sm_clock_mhz: int | None = None
    max_mem_clock_mhz: int | None = None
    base_sm_clock_mhz: int | None = None
    slowdown_temp_c: int | None = None
    shutdown_temp_c: int | None = None
    max_operating_temp_c: int | None = None
    efficiency: Efficiency | None = None
    source: str
    sources: dict[str, str] = Field(default_factory=dict)

    @field_validator("pci_device_ids")
    @classmethod
    def _upper_hex(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for item in v:
            if not item.lower().startswith("0x") or len(item) != 10:
                raise ValueError(f"PCI device id {item!r} must look like 0x233510DE")
            out.append("0x" + item[2:].upper())
        return tuple(out)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / 2**30

    def source_of(self, field: str) -> str:
        """The source of one figure: its own if it has one, else the record's."""
        return self.sources.get(field, self.source)

    def peak_tflops(self, precision: str) -> float | None:
        return self.tflops.get(precision)


class SystemModel(_Record):
    """A server (DGX/HGX class) built around one GPU model."""

    key: str
    name: str
    gpu: str
    gpus: int
    max_power_kw: float
    rack_units: int
    compute_nics: int
    compute_nic_gbps: int
    storage_nics: int = 0
    storage_nic_gbps: int = 0
    cpu: str | None = None
    system_memory_bytes: int | None = None
    local_nvme_bytes: int | None = None
    cooling: Literal["air", "liquid"] = "air"
    weight_kg: float | None = None
    # CPU topology as Slurm's NodeName line counts it (slurm.conf(5) SocketsPerBoard,
    # CoresPerSocket, ThreadsPerCore); None where no public source gives it
    cpu_sockets: int | None = None
    cpu_cores_per_socket: int | None = None
    cpu_threads_per_core: int | None = None
    # the CPU socket each GPU (by index) is attached to; None where no public source gives it
    gpu_sockets: tuple[int, ...] | None = None
    source: str
    sources: dict[str, str] = Field(default_factory=dict)

    def source_of(self, field: str) -> str:
        """The source of one figure: its own if it has one, else the record's."""
        return self.sources.get(field, self.source)

    @model_validator(mode="after")
    def _gpu_sockets_fit(self) -> SystemModel:
        if self.gpu_sockets is not None:
            if len(self.gpu_sockets) != self.gpus:
                raise ValueError(f"gpu_sockets lists {len(self.gpu_sockets)} GPUs, not {self.gpus}")
            if self.cpu_sockets is None or any(
                not 0 <= s < self.cpu_sockets for s in self.gpu_sockets
            ):
                raise ValueError("gpu_sockets needs cpu_sockets and each socket below it")
        return self


class MigProfile(_Record):
    """A GPU-instance profile (``nvidia-smi mig -lgip``) and its valid placements (``-lgipp``)."""

    name: str
    profile_id: int | None = None  # None: no capture or table gives it for this model
    compute_slices: int
    memory_slices: int
    memory_mib: int | None = None  # None: no -lgip capture for this model
    sm_count: int | None = None
    max_instances: int
    placements: tuple[int, ...]
    placement_size: int
    media_extensions: bool = False
    # Engines of the instance (MIG User Guide "Hardware Units" / -lgip DEC ENC CE JPEG OFA);
    # None where the source gives no figure.
    copy_engines: int | None = None
    decoders: int | None = None
    encoders: int | None = None
    jpeg: int | None = None
    ofa: int | None = None

    def slices_at(self, start: int) -> range:
        return range(start, start + self.placement_size)


class MigGeometry(_Record):
    """The MIG geometry of one GPU model: profiles over ``memory_slices`` memory slices."""

    model: str
    memory_slices: int = 8
    compute_slices: int = 7
    profiles: tuple[MigProfile, ...]
    source: str
    sources: dict[str, str] = Field(default_factory=dict)  # per aspect: placements, engines...

    def source_of(self, aspect: str) -> str:
        """The source of one aspect (``placements``, ``engines``...): its own, else the record's."""
        return self.sources.get(aspect, self.source)

    def instance_memory_mib(self, name: str, gpu_memory_bytes: int) -> int:
        """A profile's memory: the catalog's figure, else (for simulators) its share of the GPU's
        memory by memory slices -- an estimate, not a catalog fact."""
        prof = self.profile(name)
        if prof.memory_mib is not None:
            return prof.memory_mib
        return gpu_memory_bytes * prof.memory_slices // self.memory_slices // 2**20

    def profile(self, name: str) -> MigProfile:
        for p in self.profiles:
            if p.name == name:
                return p
        from gpufleet.errors import UnknownNameError

        known = [p.name for p in self.profiles]
        raise UnknownNameError(f"MIG profile for {self.model}", name, known)


class XidAction(StrEnum):
    """Immediate action for an XID, ordered from least to most disruptive."""

    NONE = "none"
    RESTART_APP = "restart_app"
    RESET_GPU = "reset_gpu"
    REBOOT_NODE = "reboot_node"
    DRAIN_AND_INSPECT = "drain_and_inspect"

    @property
    def rank(self) -> int:
        return list(XidAction).index(self)


class XidSeverity(StrEnum):
    INFO = "info"
    WARN = "warn"
    FAIL = "fail"


class XidEntry(_Record):
    """One XID code: meaning, how serious, what to do now."""

    code: int
    name: str
    meaning: str
    severity: XidSeverity
    action: XidAction
    application_level: bool = False
    notes: str = ""
    mnemonic: str | None = None
    nvidia_immediate_action: str | None = None  # the catalog's "Resolution Bucket (Immediate)"
    source: str


class Figure(_Record):
    """One number of the performance model and where it was measured or published."""

    value: float
    source: str


class ReferenceGpu(_Record):
    """The GPU whose measured/peak ratios apply to models without measured figures of their own."""

    gpu: str
    source: str


class PcieLaneRates(_Record):
    """Payload GB/s per PCIe lane, per generation."""

    gbps: dict[int, float]
    source: str


class PerformanceModel(_Record):
    """The measured-efficiency model: what a healthy GPU reaches, from data-sheet peaks.

    A model's own ``GpuModel.efficiency`` wins; otherwise the reference GPU's achieved/peak
    ratios are applied to its peaks. Validation's expected figures (pass lines) and the
    simulator's workload times both come from here (``gpufleet.catalog.performance``).
    """

    reference: ReferenceGpu
    matmul_peak: dict[str, Precision] = Field(default_factory=dict)
    pcie_lane: PcieLaneRates
    launch_overhead_s: Figure
    collective_link_efficiency: Figure
    collective_latency_s: Figure
    network_efficiency: Figure
    default_node_nic_gbits: Figure
    nvlink_p2p_efficiency: Figure

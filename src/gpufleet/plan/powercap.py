"""The planner's power-capped scenario: how many servers a rack holds when every GPU runs under a
lower power limit, and what that does to throughput per rack and per rack kW.

A server's power under a cap is its data-sheet maximum less, per GPU, the GPU's max power minus
the cap (the rest of the server does not change); each GPU's throughput comes from the power
model (``gpufleet.catalog.power``, bf16 matmul by default), relative to the default limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.catalog import load_catalog
from gpufleet.catalog import power as pw
from gpufleet.errors import UsageError


@dataclass(frozen=True)
class CapScenario:
    """Servers per rack and rack throughput, at the default limit and under the cap."""

    system: str
    rack_kw: float
    cap_w: float
    default_w: float
    server_kw: float
    capped_server_kw: float
    servers_per_rack: int
    capped_servers_per_rack: int
    gpu_throughput: float  # per GPU under the cap, relative to the default limit
    rack_throughput_gain: float  # (capped rack throughput / default rack throughput) - 1
    per_drawn_kw_gain: float  # throughput per kW the rack draws, capped vs default, - 1

    def sentence(self) -> str:
        return (
            f"at a {self.cap_w:g} W cap, {self.capped_servers_per_rack} {self.system} per "
            f"{self.rack_kw:g} kW rack instead of {self.servers_per_rack}; "
            f"{self.rack_throughput_gain:+.0%} throughput per rack (per budgeted rack kW), "
            f"{self.per_drawn_kw_gain:+.0%} per kW drawn"
        )


def capped_scenario(
    system: str, rack_kw: float, cap_w: float, workload: str = "matmul-bf16", rack_units: int = 38
) -> CapScenario:
    """The scenario for one system (``dgx-h100``), rack power budget and per-GPU cap."""
    sysm = load_catalog().system(system)
    gpu = load_catalog().gpu(sysm.gpu)
    lo = gpu.power_limit_min_w if gpu.power_limit_min_w is not None else 0.5 * gpu.max_power_w
    if not lo <= cap_w <= gpu.max_power_w:
        raise UsageError(f"--cap {cap_w:g} W is outside {gpu.key}'s {lo:g}-{gpu.max_power_w:g} W")
    if rack_kw < sysm.max_power_kw * 0.5:
        raise UsageError(f"--rack-kw {rack_kw:g} cannot hold one {sysm.name}")
    capped_kw = sysm.max_power_kw - sysm.gpus * (gpu.max_power_w - cap_w) / 1000.0
    by_space = rack_units // sysm.rack_units
    per_rack = min(by_space, math.floor(rack_kw / sysm.max_power_kw + 1e-9))
    per_rack_capped = min(by_space, math.floor(rack_kw / capped_kw + 1e-9))
    prof = pw.profile(workload)
    base = pw.operating_point(gpu, gpu.max_power_w, prof).relative_throughput
    rel = pw.operating_point(gpu, cap_w, prof).relative_throughput / base
    rack_default = per_rack * sysm.gpus * 1.0
    rack_capped = per_rack_capped * sysm.gpus * rel
    gain = rack_capped / rack_default - 1.0 if rack_default else math.inf
    per_kw = (
        (rack_capped / (per_rack_capped * capped_kw))
        / (rack_default / (per_rack * sysm.max_power_kw))
        - 1.0
        if rack_default and per_rack_capped
        else math.nan
    )
    return CapScenario(
        system=sysm.name,
        rack_kw=rack_kw,
        cap_w=cap_w,
        default_w=gpu.max_power_w,
        server_kw=sysm.max_power_kw,
        capped_server_kw=round(capped_kw, 3),
        servers_per_rack=per_rack,
        capped_servers_per_rack=per_rack_capped,
        gpu_throughput=round(rel, 4),
        rack_throughput_gain=round(gain, 4),
        per_drawn_kw_gain=round(per_kw, 4),
    )

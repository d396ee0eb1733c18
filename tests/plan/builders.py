"""The planner's keyword-only sizing functions with the values most cases share: each case
passes only what it is about, and the rest stays as the hand-computed figures assume."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from gpufleet.plan.cablemap import Cable
from gpufleet.plan.cost import Cost, plan_cost
from gpufleet.plan.fabric import Fabric, Layout, plan_fabric
from gpufleet.plan.facility import Facility, plan_facility
from gpufleet.plan.plant import Plant, plan_plant
from gpufleet.plan.storage import Storage, plan_storage


def fabric(
    servers: int,
    layout: Layout,
    pdus: int,
    compute_nics: int = 8,
    storage_nics: int = 2,
    management_nodes: int = 0,
) -> Fabric:
    """`plan_fabric` on 64-port 400G switches."""
    return plan_fabric(
        servers=servers,
        compute_nics=compute_nics,
        storage_nics=storage_nics,
        radix=64,
        port_gbps=400,
        layout=layout,
        pdus=pdus,
        management_nodes=management_nodes,
    )


def facility(**kw: Any) -> Facility:
    """`plan_facility` for 128 DGX B200 in 40 kW liquid-cooled racks on 415 V 60 A 2N feeds."""
    args: dict[str, Any] = dict(
        servers=128,
        server_kw=14.3,
        server_ru=10,
        server_name="NVIDIA DGX B200",
        rack_limit_kw=40.0,
        cooling="liquid",
        pue=1.15,
        usable_ru=38,
        voltage_v=415.0,
        current_a=60.0,
        phases=3,
        redundancy="2N",
        racks_available=None,
        network_kw=0.0,
        average_load=1.0,
    )
    return plan_facility(**(args | kw))


def cost(**kw: Any) -> Cost:
    """`plan_cost` of one 8-GPU server at 1 M USD drawing 10 kW at 0.1 USD/kWh for 5 years,
    with no support, space, cloud price or budget."""
    args: dict[str, Any] = dict(
        gpus=8,
        servers=1,
        racks=1,
        server_price=1_000_000.0,
        switches=0,
        transceivers=0,
        switch_price=None,
        transceiver_price=None,
        facility_kw=10.0,
        average_load=1.0,
        energy_price_kwh=0.1,
        support_per_year=None,
        support_percent=None,
        space_per_rack_month=None,
        cloud_per_gpu_hour=None,
        horizon_years=5,
        utilization=1.0,
        budget=None,
    )
    return plan_cost(**(args | kw))


def storage(**kw: Any) -> Storage:
    """`plan_storage` of a 70B model at 1 M tokens/s, a checkpoint every 300 s, 4 bytes of
    data set per token, on 128 nodes without local NVMe."""
    args: dict[str, Any] = dict(
        parameters=70e9,
        tokens_per_s=1e6,
        checkpoint_time_s=300,
        dataset_bytes_per_token=4,
        nodes=128,
        local_nvme_bytes=None,
    )
    return plan_storage(**(args | kw))


def plant(**kw: Any) -> Plant:
    """`plan_plant` of 1 MW of IT (1.15 MW facility), 2N, liquid-cooled (80 %), 5 min of
    Li-ion, 2 MW generator sets, 1 MW CDUs, coolant dT 10 K and air dT 12 K."""
    args: dict[str, Any] = dict(
        it_kw=1000,
        facility_kw=1150,
        redundancy="2N",
        cooling="liquid",
        runtime_s=300,
        battery="li-ion",
        generator_unit_kw=2000,
        liquid_fraction=0.8,
        cdu_capacity_kw=1000,
        coolant_delta_t=10,
        air_delta_t=12,
    )
    return plan_plant(**(args | kw))


def assert_cable_map_matches(f: Fabric, cables: Sequence[Cable]) -> None:
    """The cable map has one cable per fabric link (each tier of each network, out-of-band
    included), the BOM's cable lines per stock length, and no port used twice."""
    tiers = Counter((c.network, c.tier) for c in cables)
    for net, tree in (("compute", f.compute), ("storage", f.storage), ("in-band", f.inband)):
        assert tiers[(net, "node-leaf")] == tree.endpoint_links
        assert tiers[(net, "leaf-spine")] == tree.leaf_spine_links
        assert tiers[(net, "spine-core")] == tree.spine_core_links
    assert tiers[("out-of-band", "node-switch")] == f.oob_links
    bom: Counter[tuple[str, str, float]] = Counter()
    for line in f.cables:
        bom[(line.network, line.tier, line.length_m)] += line.count
    assert Counter((c.network, c.tier, c.length_m) for c in cables) == bom
    ends = [(c.a_device, c.a_port) for c in cables] + [(c.b_device, c.b_port) for c in cables]
    assert len(ends) == len(set(ends))  # no port used twice

"""The campaign planner: hand-worked plans, and invariants that hold for any fleet."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.maintenance.planner import (
    CampaignNode,
    CampaignPlan,
    PlanLimits,
    StepDurations,
    batch_size,
    campaign_order,
    plan_campaign,
)
from gpufleet.maintenance.windows import Schedule, parse_schedule
from tests.hypothesis_budget import examples

T0 = datetime(2026, 12, 1, tzinfo=UTC)  # a Tuesday
ONE_HOUR = StepDurations(drain_s=900, update_s=1800, reboot_s=600, verify_s=300, validate_level=0)


def rack_fleet(racks: int, per_rack: int, gpus: int = 8) -> list[CampaignNode]:
    return [CampaignNode(f"r{r}n{n}", gpus, f"r{r}") for r in range(racks) for n in range(per_rack)]


def test_one_hour_nodes_two_at_a_time_take_half_the_serial_time() -> None:
    # 8 nodes of 1 h each, 2 at once (one per rack), no window: 4 h; one at a time: 8 h.
    assert ONE_HOUR.total_s == 3600
    plan = plan_campaign(rack_fleet(4, 2), PlanLimits(batch=2, floor=0.5), Schedule(), ONE_HOUR, T0)
    assert plan.duration_s == 4 * 3600
    assert plan.ideal_s == 4 * 3600
    assert plan.serial_s == 8 * 3600
    assert plan.parallelism == 2
    assert plan.min_in_service == 0.75  # 2 of 8 nodes out
    # consecutive starts land in different racks
    first_two = [p.domain for p in plan.nodes[:2]]
    assert len(set(first_two)) == 2


def test_the_floor_limits_parallelism_below_the_batch() -> None:
    # 10 nodes x 8 GPUs; floor 80 % leaves 16 GPUs = 2 nodes out, though the batch allows 5.
    plan = plan_campaign(
        rack_fleet(10, 1), PlanLimits(batch=5, floor=0.8), Schedule(), ONE_HOUR, T0
    )
    assert max(Counter(p.start for p in plan.nodes).values()) == 2
    assert plan.duration_s == 5 * 3600
    assert plan.min_in_service == 0.8


def test_nodes_already_out_of_service_go_first_and_cost_no_capacity() -> None:
    nodes = rack_fleet(4, 1)
    nodes[3] = CampaignNode("r3n0", 8, "r3", in_service=False)
    # 32 GPUs, 8 already out: floor 75 % leaves no room for an in-service node while r3n0 runs,
    # and r3n0 itself needs none.
    plan = plan_campaign(nodes, PlanLimits(batch=4, floor=0.5), Schedule(), ONE_HOUR, T0)
    assert plan.nodes[0].name == "r3n0"
    assert plan.min_in_service == 0.5


def test_a_node_that_would_break_the_floor_is_not_planned_and_says_why() -> None:
    nodes = [CampaignNode("big", 64, "r0"), CampaignNode("small", 8, "r1")]
    plan = plan_campaign(nodes, PlanLimits(batch=2, floor=0.5), Schedule(), ONE_HOUR, T0)
    assert [p.name for p in plan.nodes] == ["small"]
    assert plan.unplannable[0][0] == "big" and "below the floor" in plan.unplannable[0][1]


def test_work_waits_for_the_window_and_fits_inside_it() -> None:
    # Saturday 02:00-04:00 UTC fits two one-hour slots per node at a time.
    sched = parse_schedule(["Sat 02:00-04:00 UTC"])
    plan = plan_campaign(rack_fleet(3, 1), PlanLimits(batch=1, floor=0.5), sched, ONE_HOUR, T0)
    sat = datetime(2026, 12, 5, 2, tzinfo=UTC)
    assert [p.start for p in plan.nodes] == [sat, sat + timedelta(hours=1), sat + timedelta(days=7)]
    assert plan.windows_used == 2


def test_a_node_longer_than_any_window_is_not_planned() -> None:
    sched = parse_schedule(["Sat 02:00-02:30 UTC"])
    plan = plan_campaign(rack_fleet(1, 1), PlanLimits(batch=1, floor=0.0), sched, ONE_HOUR, T0)
    assert not plan.nodes and "do not fit in any window" in plan.unplannable[0][1]


def test_order_round_robins_racks() -> None:
    order = [n.name for n in campaign_order(rack_fleet(3, 2))]
    assert order == ["r0n0", "r1n0", "r2n0", "r0n1", "r1n1", "r2n1"]


def test_batch_percent_of_the_fleet() -> None:
    assert batch_size("5%", 1000) == 50
    assert batch_size("5%", 10) == 1  # never zero
    assert batch_size("3", 10) == 3


def _check_invariants(
    plan: CampaignPlan,
    nodes: list[CampaignNode],
    limits: PlanLimits,
    sched: Schedule,
    per_node_s: float,
) -> None:
    total = sum(n.gpus for n in nodes)
    by_name = {n.name: n for n in nodes}
    planned = [p.name for p in plan.nodes]
    assert len(planned) == len(set(planned))  # nobody updated twice
    skipped = {n for n, _ in plan.unplannable}
    assert set(planned) | skipped == {n.name for n in nodes if n.selected}
    events = sorted({p.start for p in plan.nodes} | {p.end for p in plan.nodes})
    for t in events:  # the state just after each instant
        active = [p for p in plan.nodes if p.start <= t < p.end]
        assert len(active) <= limits.batch
        assert max(Counter(p.domain for p in active).values(), default=0) <= limits.per_domain
        out = sum(n.gpus for n in nodes if not n.in_service)
        out += sum(by_name[p.name].gpus for p in active if by_name[p.name].in_service)
        assert (total - out) / total >= limits.floor - 1e-9
    for p in plan.nodes:
        assert (p.end - p.start).total_seconds() == per_node_s
        close = sched.open_until(p.start)
        assert close is not None and p.end <= close  # started in a window, ends inside it
    assert plan.min_in_service >= limits.floor - 1e-9


@settings(max_examples=examples(60), deadline=None)
@given(
    racks=st.integers(1, 6),
    per_rack=st.integers(1, 5),
    batch=st.integers(1, 8),
    per_domain=st.integers(1, 3),
    floor=st.sampled_from([0.5, 0.75, 0.9, 0.95]),
    out=st.integers(0, 3),
    window=st.sampled_from([[], ["Sat 02:00-06:00 Europe/Berlin"], ["Mon-Fri 22:00-02:00 UTC"]]),
)
def test_plans_never_break_the_limits(
    racks: int,
    per_rack: int,
    batch: int,
    per_domain: int,
    floor: float,
    out: int,
    window: list[str],
) -> None:
    nodes = rack_fleet(racks, per_rack)
    for i in range(min(out, len(nodes))):
        nodes[i] = CampaignNode(nodes[i].name, 8, nodes[i].domain, in_service=False)
    limits = PlanLimits(batch=batch, floor=floor, per_domain=per_domain)
    sched = parse_schedule(window)
    plan = plan_campaign(nodes, limits, sched, ONE_HOUR, T0, with_serial=False)
    if any(not n.in_service for n in nodes) and plan.min_in_service < floor:
        return  # the fleet started below the floor: only out-of-service nodes may go
    _check_invariants(plan, nodes, limits, sched, ONE_HOUR.total_s)

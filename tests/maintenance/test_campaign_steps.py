"""The campaign engine's table of step handlers (`gpufleet.control.campaigns.steps.RULES`):
every step a node waits in has one rule, every step a rule may lead to is a step, and a
handler that takes a step outside its rule is refused before anything is written."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpufleet.control.campaigns.spec import FINAL_STEPS, IN_FLIGHT, NodeStep
from gpufleet.control.campaigns.steps import RULES, NodePass


def test_every_step_in_flight_has_one_rule_and_no_final_step_has_one() -> None:
    assert set(RULES) == set(IN_FLIGHT)
    assert not set(RULES) & set(FINAL_STEPS)
    for step, rule in RULES.items():
        assert rule.step is step and rule.leads_to and step not in rule.leads_to


def test_the_table_reaches_every_step_from_cordoned() -> None:
    reached, todo = {NodeStep.CORDONED}, [NodeStep.CORDONED]
    while todo:
        for nxt in RULES[todo.pop()].leads_to - reached:
            reached.add(nxt)
            if nxt in RULES:
                todo.append(nxt)
    assert reached == set(IN_FLIGHT) | {NodeStep.DONE, NodeStep.FAILED, NodeStep.SKIPPED}


def test_a_step_outside_the_rule_is_refused_before_anything_is_written() -> None:
    written: list[Any] = []
    uow = SimpleNamespace(s=SimpleNamespace(add=written.append), store=None)
    mn = SimpleNamespace(step=NodeStep.CORDONED.value, node="n1", step_since_s=0.0)
    c = SimpleNamespace(id=1, state="running")
    p = NodePass(uow, c, mn, None, None, [], 0.0, RULES[NodeStep.CORDONED].leads_to)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cordoned -> done is not in the table"):
        p.take(NodeStep.DONE, "skipping the update")
    assert written == [] and mn.step == NodeStep.CORDONED.value

"""Issue 18 in a real browser: the node page on a replica that is not the one holding the
node's recent samples draws them (forwarded from the holder), and once the holder is dead says
so above the charts ("Partial: ...", naming the holder) instead of showing an empty chart as if
the node had no data. Two controller processes on PostgreSQL, a real agent pushing to one."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.testing.procs import AgentProcess, ControllerProcess
from gpufleet.testing.testbed import wait_for
from tests.control.conftest import pg_url  # noqa: F401  (the PostgreSQL fixture)
from tests.integration.test_ha_series import NODE, get, two  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow


def test_node_page_on_another_replica_draws_the_holders_samples_then_says_partial(
    two: tuple[ControllerProcess, ControllerProcess, AgentProcess, dict[str, str]],  # noqa: F811
    page: Any,
) -> None:
    a, b, _agent, tokens = two

    def forwarded() -> bool:
        r = get(b, tokens["admin"], fields=["power_w"])
        return r.status_code == 200 and r.json()["source"] == "peer" and len(r.json()["t"]) >= 4

    wait_for(forwarded, 120.0, "A's samples read through B", step_s=0.3)
    page.goto(f"{b.url}/#token={tokens['t1']}&/node/{NODE}")  # tenant t1's viewer, on B
    page.wait_for_function("document.querySelectorAll('#charts svg.chart').length === 4")
    lines = page.eval_on_selector_all(
        "[data-chart=power_w] path.ln", "ps => ps.filter(p => p.getAttribute('d')).length"
    )
    assert lines == 2  # both GPUs' samples, which only A holds
    assert page.inner_text("#chart-note").strip() == ""

    a.kill9()
    note = page.wait_for_selector("#chart-note [role=status]", timeout=30_000)
    assert note is not None
    text = note.inner_text()
    assert text.startswith("Partial:") and a.url in text and "did not answer" in text, text
    assert tokens["t1"] not in text

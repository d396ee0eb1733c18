"""Issue 18 in a real browser: the node page on a replica that is not the one holding the
node's recent samples draws them (forwarded from the holder), and once the holder is dead says
so above the charts ("Partial: ...", naming the holder) instead of showing an empty chart as if
the node had no data. Two controller processes on PostgreSQL, a real agent pushing to one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.testing.procs import AgentProcess, ControllerProcess, stop_all
from gpufleet.testing.testbed import wait_for
from tests.control.conftest import _reset_pg, pg_url  # noqa: F401  (the PostgreSQL fixture)
from tests.integration.test_ha_series import NODE, _tokens, get

pytestmark = pytest.mark.slow


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.set_default_timeout(15_000)
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def test_node_page_on_another_replica_draws_the_holders_samples_then_says_partial(
    pg_url: str,  # noqa: F811
    tmp_path: Path,
    page: Any,
) -> None:
    _reset_pg(pg_url)
    tokens = _tokens(pg_url)
    ctls = []
    for name in ("a", "b"):
        c = ControllerProcess(tmp_path / name, tokens["admin"], db_url=pg_url, scheduler="none")
        c.args = ["--advertise-url", c.url]
        ctls.append(c)
    for c in ctls:
        c.start()
    a, b = ctls
    agent = AgentProcess(NODE, a.url, tokens["agent"], tmp_path / "agent", push_interval_s=0.25)
    agent.start()
    try:

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
    finally:
        stop_all([agent])
        for c in ctls:
            c.stop()

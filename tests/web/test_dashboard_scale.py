"""The dashboard at 10,000 nodes x 8 GPUs in a real browser (Debian's chromium through
Playwright) against a real controller: the heatmap has more cells than the page has pixels, so
it shows one tile per rack (as many as the test's own count of racks), a rack with a failing
node is framed red, a click on a rack draws that rack's nodes and a second click folds them
again; the nodes table pages through the fleet 100 rows at a time."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serving import serve_app
from tests.web.conftest import artifacts_dir

pytestmark = pytest.mark.slow

NODES = 10_000
RACK = 16  # nodes per rack (bulkfleet.register)
FAIL_EVERY = 100  # node i fails when i % 100 == 7 (bulkfleet.fill)


def name(i: int) -> str:
    return f"gpu-{i:05d}"


def rack(i: int) -> str:
    return f"r{i // RACK:03d}"


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[dict[str, Any]]:
    """A controller holding 10,000 nodes (registered in bulk, one batch each through ingest);
    its background loop is not started, so no node goes lost while the browser looks."""
    _ = browser
    from gpufleet.control.api.app import create_app
    from gpufleet.control.service import ControlService, ServiceConfig
    from gpufleet.control.state.remediation import RemediationPolicy
    from gpufleet.testing import bulkfleet

    svc = ControlService(
        ServiceConfig(
            data_dir=tmp_path_factory.mktemp("big") / "data",
            policy=RemediationPolicy(require_validation=False),
        )
    )
    svc.ingest.start()
    now = time.time()
    names = [name(i) for i in range(NODES)]
    bulkfleet.register(svc.store, names, now, racks_of=RACK)
    bulkfleet.fill(svc.store, names, now, devices=False, fail_every=FAIL_EVERY)
    token = svc.store.tokens.create("viewer", name="web-scale")[0]
    try:
        with serve_app(create_app(svc), access_log=False) as port:
            yield {"url": f"http://127.0.0.1:{port}/#token={token}", "service": svc}
    finally:
        svc.ingest.stop()
        svc.engine.dispose()


@pytest.fixture
def page(page: Any) -> Any:
    """The shared page (tests/web/conftest.py), with more time: the 10,000-node page is big."""
    page.set_default_timeout(20_000)
    return page


def _frame_rgb(page: Any, key: str) -> list[int]:
    """The pixel one CSS px inside the top-left corner of group ``key``'s tile (its frame)."""
    return list(
        page.evaluate(
            """(key) => {
              const hm = window.__gpufleetHeatmap;
              const t = hm.groupTiles.find((x) => x.key === key);
              const dpr = window.devicePixelRatio || 1;
              const d = hm.canvas.getContext('2d')
                .getImageData(Math.round((t.x + 1) * dpr), Math.round((t.y + 1) * dpr), 1, 1).data;
              return [d[0], d[1], d[2]];
            }""",
            key,
        )
    )


def _click_group(page: Any, key: str) -> None:
    """A real mouse click on the centre of group ``key``'s tile."""
    page.evaluate("window.scrollTo(0, 0)")
    box = page.locator("canvas.heatmap").bounding_box()
    p = page.evaluate("(key) => window.__gpufleetHeatmap.groupCenter(key)", key)
    page.mouse.click(box["x"] + p["x"], box["y"] + p["y"])


def test_heatmap_folds_10000_nodes_into_racks_and_expands_one(
    big: dict[str, Any], page: Any
) -> None:
    racks = math.ceil(NODES / RACK)
    page.goto(big["url"])
    page.wait_for_function("window.__gpufleetFirstRender !== undefined", timeout=60_000)
    tiles = page.evaluate("window.__gpufleetHeatmap.groupTiles.map((t) => t.key)")
    assert len(tiles) == racks
    assert tiles[:2] == [rack(0), rack(RACK)]
    caption = page.inner_text("#hm-caption")
    assert caption.startswith(f"{racks} racks of {NODES} nodes × {NODES * 8} GPUs"), caption
    # no node drawn one by one until a rack is expanded
    assert page.evaluate("window.__gpufleetHeatmap.byName.size") == 0
    # node 7 fails (a fail finding: drained) so its rack r000 is framed red (#e5383b); rack
    # r001 (nodes 16-31) has no failing node and no red frame
    red = _frame_rgb(page, rack(7))
    assert red[0] > 200 and red[1] < 90 and red[2] < 90, red
    calm = _frame_rgb(page, rack(16))
    assert not (calm[0] > 200 and calm[1] < 90), calm
    page.screenshot(path=str(Path(artifacts_dir()) / "dashboard-10000-nodes.png"))

    # a click on rack r003 draws its 16 nodes (48-63) under the rack tiles
    want = sorted(name(i) for i in range(NODES) if rack(i) == "r003")
    assert len(want) == RACK
    _click_group(page, "r003")
    page.wait_for_function(f"window.__gpufleetHeatmap.byName.size === {RACK}")
    shown = sorted(page.evaluate("[...window.__gpufleetHeatmap.byName.keys()]"))
    assert shown == want
    cell = page.evaluate(f"window.__gpufleetHeatmap.cellCenter('{want[0]}', 7)")
    assert cell is not None and cell["y"] > page.evaluate("window.__gpufleetHeatmap.nodesTop")
    assert "16 nodes of 1 expanded" in page.inner_text("#hm-caption")
    page.screenshot(path=str(Path(artifacts_dir()) / "dashboard-10000-nodes-expanded.png"))
    # a second click folds it again
    _click_group(page, "r003")
    page.wait_for_function("window.__gpufleetHeatmap.byName.size === 0")


def test_nodes_table_pages_through_10000_nodes(big: dict[str, Any], page: Any) -> None:
    page.goto(big["url"] + "&/nodes")
    page.wait_for_selector("#nodes-table tbody tr")
    assert page.inner_text("#n-count") == f"1-100 of {NODES} nodes"
    rows = page.eval_on_selector_all("#nodes-table tbody tr", "rs => rs.map(r => r.dataset.node)")
    assert rows == [name(i) for i in range(100)]
    page.click("#n-next")
    page.wait_for_function("document.querySelector('#n-count').textContent.startsWith('101-200')")
    first = page.eval_on_selector("#nodes-table tbody tr", "r => r.dataset.node")
    assert first == name(100)
    # the filter searches the whole fleet on the server: rack r624 holds the last 16 nodes
    page.fill("#n-filter", "r624")
    page.wait_for_function(
        f"document.querySelector('#n-count').textContent === '1-{RACK} of {RACK} nodes'"
    )
    rows = page.eval_on_selector_all("#nodes-table tbody tr", "rs => rs.map(r => r.dataset.node)")
    assert rows == [name(i) for i in range(NODES - RACK, NODES)]

"""The planner's power-capped scenario: servers per rack and throughput under a per-GPU cap."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpufleet.catalog import load_catalog
from gpufleet.catalog import power as pw
from gpufleet.cli.app import app
from gpufleet.errors import UsageError
from gpufleet.plan.powercap import capped_scenario


def test_560w_cap_fits_four_dgx_h100_in_a_40kw_rack_instead_of_three() -> None:
    s = capped_scenario("dgx-h100", 40, 560)
    # DGX H100: 10.2 kW max (datasheet); 8 GPUs x (700 - 560) W = 1.12 kW less per server
    assert s.capped_server_kw == pytest.approx(10.2 - 1.12)
    assert (s.servers_per_rack, s.capped_servers_per_rack) == (3, 4)
    h100 = load_catalog().gpu("h100-sxm")
    prof = pw.profile("matmul-bf16")
    rel = (
        pw.operating_point(h100, 560, prof).relative_throughput
        / pw.operating_point(h100, 700, prof).relative_throughput
    )
    assert 0.8 < rel < 1.0  # a cap costs each GPU some speed...
    assert s.rack_throughput_gain == pytest.approx(4 * rel / 3 - 1, abs=1e-3)
    assert s.rack_throughput_gain > 0.15  # ...but a rack does more with a fourth server


def test_a_cap_that_adds_no_server_only_loses_throughput() -> None:
    s = capped_scenario("dgx-h100", 40, 680)  # 10.04 kW a server: still 3
    assert s.capped_servers_per_rack == s.servers_per_rack == 3
    assert s.rack_throughput_gain < 0


def test_cap_out_of_range_is_refused() -> None:
    with pytest.raises(UsageError, match="200-700 W"):
        capped_scenario("dgx-h100", 40, 100)


def test_cli_rack_json() -> None:
    res = CliRunner().invoke(
        app, ["power", "rack", "--system", "dgx-h200", "--rack-kw", "40", "--cap", "560", "--json"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["capped_servers_per_rack"] == 4 and doc["servers_per_rack"] == 3

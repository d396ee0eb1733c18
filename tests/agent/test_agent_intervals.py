"""The agent's intervals are checked before it starts (in process: nothing is opened before
the check): a push interval shorter than the controller's shortest heartbeat interval
(`gpufleet.wire.limits.MIN_HEARTBEAT_S`) is a clear error, not batches refused later."""

from __future__ import annotations

from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.errors import UsageError


def test_a_push_interval_under_the_shortest_heartbeat_is_refused() -> None:
    res = CliRunner().invoke(app, ["agent", "--sim", "1x2xh100", "--push-interval", "0.05"])
    assert isinstance(res.exception, UsageError), res.output
    assert "--push-interval 0.05: at least 0.1 s" in str(res.exception)

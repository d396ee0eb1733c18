"""A job's energy (issue 16): the embedded scheduler places a one-GPU job on a node whose two
GPUs draw different, constant power; the job's energy is its GPU's power times the time it
held the GPU (computed here from the known watts), not the node's; `gpufleet jobs show` and
`gpufleet energy report` print the same over HTTP."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.control.api.app import create_app
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.devices.sim import ManualClock
from gpufleet.schedulers.base import JobSpec
from gpufleet.schedulers.embedded.backend import EmbeddedBackend
from gpufleet.wire import Batch
from tests.serving import serve_app

from .conftest import T0, batch, push

pytestmark = pytest.mark.process


runner = CliRunner()

WATTS = (300.0, 500.0)  # GPU 0, GPU 1
PRICE = 0.3


def _slots(node: str, seq: int, t: float) -> Batch:
    return Batch.model_validate(
        {
            "node": node,
            "agent_id": f"agent-{node}",
            "seq": seq,
            "sent_at_s": t,
            "jobs": {
                "lease_s": 30,
                "slots": [
                    {"index": g, "model": "h100-sxm", "memory_bytes": 80 << 30} for g in (0, 1)
                ],
                "copies": [],
            },
        }
    )


def _power(seq: int, t: float) -> dict[str, Any]:
    b = batch("n1", seq, gpus=2, t=t, k=60, devices=seq == 1)
    for g, s in enumerate(b["samples"]):
        s["fields"]["power_w"] = [WATTS[g]] * 60
    return b


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ControlService]:
    svc = ControlService(
        ServiceConfig(
            data_dir=tmp_path / "data",
            tick_s=60.0,
            policy=RemediationPolicy(require_validation=False, energy_price_per_kwh=PRICE),
        ),
        clock=ManualClock(T0),
        scheduler=EmbeddedBackend(tick_s=60.0),
    )
    svc.start()
    yield svc
    svc.stop()


def test_a_job_is_charged_its_gpus_energy_while_it_held_them(
    service: ControlService, tmp_path: Path
) -> None:
    backend = service.scheduler
    assert isinstance(backend, EmbeddedBackend)
    clock = service.clock
    assert isinstance(clock, ManualClock)
    push(service, _power(1, T0))
    clock.advance(30)
    backend.exchange(_slots("n1", 1, clock()), clock())
    jid = backend.submit(JobSpec(name="train", command=("sim",), gpus=1))
    backend.tick()  # placed at T0 + 30
    gpu = backend.job(jid).gpus[0]
    for m in range(1, 5):
        push(service, _power(m + 1, T0 + 60 * m))
        service.flush_rollups()  # the controller's periodic flush (every 15 s)
    clock.advance(150)
    backend.cancel(jid)  # ends at T0 + 180
    clock.advance(120)
    service.flush_rollups()
    want_kwh = WATTS[gpu] * 150 / 3.6e6
    c = TestClient(create_app(service))
    tok = service.store.tokens.create("viewer")[0]
    got = c.get(f"/api/v1/jobs/{jid}", headers={"Authorization": f"Bearer {tok}"}).json()
    assert got["energy"]["kwh"] == pytest.approx(want_kwh, rel=0.01)
    assert got["energy"]["cost"] == pytest.approx(want_kwh * PRICE, rel=0.01)
    rep = c.get(
        "/api/v1/energy", params={"by": "job"}, headers={"Authorization": f"Bearer {tok}"}
    ).json()
    assert [(r["key"], r["name"]) for r in rep["rows"]] == [(jid, "train")]
    assert rep["rows"][0]["kwh"] == pytest.approx(want_kwh, rel=0.01)
    # the total under a jobs table is the jobs' energy, not every GPU's (both GPUs ran 299 s)
    assert rep["total"]["kwh"] == pytest.approx(want_kwh, rel=0.01)
    # the CLI against the controller over HTTP: jobs show and energy report (CSV, JSON)
    tok_file = tmp_path / "token"
    tok_file.write_text(tok)
    tok_file.chmod(0o600)
    with _serve(service) as url:
        common = ["--controller", url, "--token-file", str(tok_file)]
        r = runner.invoke(app, ["jobs", "show", jid, *common])
        assert r.exit_code == 0, r.output
        line = next(ln for ln in r.output.splitlines() if "energy:" in ln)
        assert f"{want_kwh:.3f} kWh" in line and f"{want_kwh * PRICE:.2f} USD" in line
        r = runner.invoke(app, ["energy", "report", "--by", "job", "--csv", *common])
        assert r.exit_code == 0, r.output
        rows = list(csv.DictReader(io.StringIO(r.output)))
        assert rows[0]["key"] == jid
        assert float(rows[0]["kwh"]) == pytest.approx(want_kwh, rel=0.01)
        r = runner.invoke(app, ["energy", "report", "--by", "node", "--json", *common])
        node_kwh = json.loads(r.output)["rows"][0]["kwh"]
        assert node_kwh == pytest.approx(sum(WATTS) * 299 / 3.6e6, rel=0.01)  # both GPUs
        r = runner.invoke(app, ["energy", "report", "--since", "yesterday", *common])
        assert r.exit_code != 0 and "since" in str(r.exception)


@contextlib.contextmanager
def _serve(svc: ControlService) -> Iterator[str]:
    with serve_app(create_app(svc)) as port:
        yield f"http://127.0.0.1:{port}"

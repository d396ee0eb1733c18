"""The recurring maintenance policy: occurrence dates worked out by hand from the calendar
(and the EU daylight-saving rule: clocks change on the last Sunday of March and October at
01:00 UTC), validation errors that name the field, and the proposal end to end on a real
controller: policy set over the API, a campaign proposed over the drifting nodes (not
started), started by an operator with `maintenance start --proposal`, refused to a viewer."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.control.state.remediation import load_policy
from gpufleet.errors import ConfigError
from gpufleet.maintenance.recurring import MaintenancePolicy, nth_weekday
from gpufleet.testing.testbed import Controller
from tests.maintenance.conftest import register

runner = CliRunner()
OLD, NEW = "535.104.05", "550.90.07"
BASELINE = {"models": {"h100-sxm": {"driver": NEW}}}


def policy(**kw: Any) -> MaintenancePolicy:
    body = {
        "every": "quarterly",
        "on": "first Saturday",
        "window": "02:00-06:00 Europe/Berlin",
        "baseline": BASELINE,
        "update_command": "/usr/local/sbin/site-update",
        **kw,
    }
    return MaintenancePolicy.model_validate(body)


def z(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_nth_weekday_by_hand() -> None:
    # 1 January 2027 is a Friday (2026 starts on a Thursday and has 365 days)
    assert nth_weekday(2027, 1, 0, 5) == z("2027-01-02").date()  # first Saturday
    assert nth_weekday(2027, 1, 1, 4) == z("2027-01-08").date()  # second Friday
    assert nth_weekday(2027, 3, -1, 6) == z("2027-03-28").date()  # last Sunday of March
    assert nth_weekday(2027, 10, -1, 6) == z("2027-10-31").date()  # 31 October is a Sunday


def test_quarterly_first_saturday_across_the_summer_time_change() -> None:
    p = policy()
    # winter: 02:00 Berlin is UTC+1, so 01:00Z
    assert p.next_occurrence(z("2026-12-01T00:00")) == (
        z("2027-01-02T01:00"),
        z("2027-01-02T05:00"),
    )
    # inside the window: that occurrence is still the next one
    assert p.next_occurrence(z("2027-01-02T03:00"))[0] == z("2027-01-02T01:00")
    # after it ended: April (1 April 2027 is a Thursday), summer time UTC+2, so 00:00Z
    assert p.next_occurrence(z("2027-01-02T05:00")) == (
        z("2027-04-03T00:00"),
        z("2027-04-03T04:00"),
    )


def test_monthly_last_sunday_on_the_dst_days() -> None:
    p = policy(every="monthly", on="last Sunday")
    # 28 March 2027: 02:00 local does not exist (01:00Z jumps to 03:00 CEST); read with the
    # offset before the change, it is 01:00Z, and 06:00 CEST is 04:00Z: a 3-hour window
    assert p.next_occurrence(z("2027-03-01T00:00")) == (
        z("2027-03-28T01:00"),
        z("2027-03-28T04:00"),
    )
    # 31 October 2027: 02:00 happens twice; the first (CEST) is 00:00Z, 06:00 CET is 05:00Z
    assert p.next_occurrence(z("2027-10-01T00:00")) == (
        z("2027-10-31T00:00"),
        z("2027-10-31T05:00"),
    )


def test_weekly_and_other_zones() -> None:
    p = policy(every="weekly", on="Saturday", window="22:00-02:00 America/New_York")
    # Tuesday 1 December 2026 -> Saturday 5 December, 22:00 EST (UTC-5) = 03:00Z on the 6th
    assert p.next_occurrence(z("2026-12-01T00:00")) == (
        z("2026-12-06T03:00"),
        z("2026-12-06T07:00"),
    )
    assert p.weekly_window() == "Sat 22:00-02:00 America/New_York"


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("on", "first Satdayy", ["maintenance.on", "Satdayy"]),
        ("on", "fifth Saturday", ["maintenance.on", "first, second"]),
        ("window", "02:00 Europe/Berlin", ["maintenance.window", "HH:MM-HH:MM"]),
        ("window", "02:00-06:00 Mars/Base", ["maintenance.window", "Mars/Base"]),
        ("every", "yearly", ["maintenance.every", "quarterly"]),
        ("floor", "190%", ["maintenance.floor", "190%"]),
        ("batch", "0", ["maintenance.batch"]),
        ("baseline", "missing.yaml", ["maintenance.baseline", "missing.yaml"]),
        ("colour", "red", ["maintenance.colour"]),
    ],
)
def test_bad_policy_names_the_field(tmp_path: Path, key: str, value: str, words: list[str]) -> None:
    body = {
        "every": "quarterly",
        "on": "first Saturday",
        "window": "02:00-06:00 UTC",
        "baseline": "baseline.yaml",
        "update_command": "true",
        key: value,
    }
    (tmp_path / "baseline.yaml").write_text(json.dumps(BASELINE), encoding="utf-8")
    f = tmp_path / "policy.yaml"
    f.write_text(json.dumps({"maintenance": body}), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_policy(f)
    for w in [str(f), *words]:
        assert w in str(err.value)


def test_yaml_on_key_and_baseline_next_to_the_policy(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(f'models:\n  h100-sxm:\n    driver: "{NEW}"\n')
    f = tmp_path / "policy.yaml"
    f.write_text(  # a bare `on:` is the boolean true in YAML 1.1: taken as the field
        "maintenance:\n  every: monthly\n  on: second Tuesday\n"
        "  window: 01:00-03:00 UTC\n  baseline: b.yaml\n  update_command: /bin/true\n"
    )
    p = load_policy(f).maintenance
    assert p is not None and p.on == "second Tuesday"
    assert p.baseline.models["h100-sxm"].driver == NEW
    with pytest.raises(ValueError, match="inline"):  # over the API a path is refused
        MaintenancePolicy.model_validate({**p.model_dump(), "baseline": "b.yaml"})


@pytest.mark.process
def test_policy_proposes_and_an_operator_starts_it(tmp_path: Path, ctl: Controller) -> None:
    register(ctl, "old1", OLD)
    register(ctl, "old2", OLD)
    register(ctl, "new1", NEW)
    admin = {"Authorization": f"Bearer {ctl.admin}"}
    pol = httpx.get(ctl.url + "/api/v1/policy", headers=admin).json()
    pol["maintenance"] = {  # weekly and proposed up to 8 days ahead: always due
        "every": "weekly",
        "on": "Saturday",
        "window": "02:00-06:00 Europe/Berlin",
        "baseline": BASELINE,
        "update_command": "true",
        "batch": "1",
        "floor": "0%",
        "propose_days_before": 8,
    }
    r = httpx.put(ctl.url + "/api/v1/policy", json=pol, headers=admin)
    assert r.status_code == 200, r.text
    proposal: dict[str, Any] = {}
    end = time.monotonic() + 20
    while time.monotonic() < end and not proposal:
        rows = httpx.get(ctl.url + "/api/v1/maintenance/campaigns", headers=admin).json()
        proposal = next((c for c in rows if c["state"] == "proposed"), {})
        time.sleep(0.2)
    assert proposal, "no campaign proposed within 20 s"
    assert proposal["by_step"] == {"selected": 2}
    assert proposal["created_by"].startswith("policy:maintenance@")
    doc = httpx.get(
        ctl.url + f"/api/v1/maintenance/campaigns/{proposal['id']}", headers=admin
    ).json()
    assert sorted(n["node"] for n in doc["nodes"]) == ["old1", "old2"]
    assert doc["windows"] == ["Sat 02:00-06:00 Europe/Berlin"]
    nxt = httpx.get(ctl.url + "/api/v1/maintenance/policy", headers=admin).json()["next"]
    assert datetime.fromisoformat(nxt["start"]).astimezone(UTC).weekday() == 5
    time.sleep(0.6)  # several ticks: it stays proposed, nothing is cordoned
    rows = httpx.get(ctl.url + "/api/v1/maintenance/campaigns", headers=admin).json()
    assert [c["state"] for c in rows] == ["proposed"]  # one proposal per occurrence
    viewer, op = tmp_path / "v.token", tmp_path / "op.token"
    viewer.write_text(ctl.token("viewer"), encoding="utf-8")
    op.write_text(ctl.token("operator"), encoding="utf-8")
    args = ["maintenance", "start", "--proposal", str(proposal["id"]), "--controller", ctl.url]
    res = runner.invoke(app, [*args, "--token-file", str(viewer)])
    assert res.exit_code != 0 and "403" in str(res.exception)
    res = runner.invoke(app, [*args, "--token-file", str(op), "--json"])
    assert res.exit_code == 0, res.output
    started = json.loads(res.output)
    assert started["state"] == "running" and started["id"] == proposal["id"]

"""Every generated alert rule is unit-tested by the real promtool (issue 29): the shipped test
file (`gpufleet.cli.prometheus_rule_tests`, written by ``config prometheus --rules-tests-out``)
holds, per alert, an evaluation where it fires, with the labels and words the on-call engineer
reads, and one where it stays quiet; it passes against the generated rules, and it fails
against the rule that never alerted on the first XID of a code."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.cli.config_prometheus import ALERT_RULES, rules_doc
from gpufleet.cli.prometheus_rule_tests import alerts_checked, rule_tests_doc
from gpufleet.errors import UsageError
from tests.agent.conftest import need_binary


def _promtool(test_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [need_binary("promtool"), "test", "rules", test_file.name],
        cwd=test_file.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _write(tmp_path: Path, rules: dict[str, Any]) -> Path:
    (tmp_path / "gpufleet-rules.yml").write_text(yaml.safe_dump(rules), encoding="utf-8")
    test = tmp_path / "rules_test.yml"
    test.write_text(yaml.safe_dump(rule_tests_doc()), encoding="utf-8")
    return test


def test_every_generated_alert_has_a_case_that_fires_and_one_that_stays_quiet() -> None:
    checked = alerts_checked(rule_tests_doc())
    names = {str(r["alert"]) for r in ALERT_RULES}
    assert set(checked) == names, set(checked) ^ names
    for name, (fired, quiet) in checked.items():
        assert fired >= 1 and quiet >= 1, (name, fired, quiet)


@pytest.mark.process
def test_promtool_passes_every_case_against_the_generated_rules(tmp_path: Path) -> None:
    out = _promtool(_write(tmp_path, rules_doc()))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@pytest.mark.process
def test_the_old_xid_rule_misses_the_first_xid_and_promtool_says_so(tmp_path: Path) -> None:
    # the rule as it was: `increase` over a counter series born at 1 sees no increase
    rules = copy.deepcopy(rules_doc())
    for group in rules["groups"]:  # type: ignore[attr-defined]
        for rule in group["rules"]:
            if rule["alert"] == "GpufleetXidErrors":
                rule["expr"] = "increase(gpufleet_xid_errors_total[10m]) > 0"
    out = _promtool(_write(tmp_path, rules))
    assert out.returncode != 0
    text = out.stdout + out.stderr
    # the first XID 79 at 3m, the first XIDs 13 and 999 at 2m
    assert "alertname: GpufleetXidErrors, time: 3m" in text, text
    assert "alertname: GpufleetXidErrors, time: 2m" in text, text
    # the only failures are the first XIDs': a second one, and an old XID's next one, are seen
    # by `increase`
    assert text.count("alertname:") == 2, text


@pytest.mark.process
def test_config_prometheus_writes_rules_and_their_tests_for_promtool(tmp_path: Path) -> None:
    rules, tests = tmp_path / "rules" / "gpufleet.yml", tmp_path / "tests" / "gpufleet_test.yml"
    rules.parent.mkdir()
    tests.parent.mkdir()
    args = ["config", "prometheus", "--rules-out", str(rules), "--rules-tests-out", str(tests)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(tests.read_text(encoding="utf-8"))["rule_files"] == [
        "../rules/gpufleet.yml"
    ]
    out = _promtool(tests)
    assert out.returncode == 0, out.stdout + out.stderr


def test_rules_tests_without_the_rules_file_is_a_clear_error(tmp_path: Path) -> None:
    args = ["config", "prometheus", "--rules-tests-out", str(tmp_path / "t.yml")]
    res = CliRunner().invoke(app, args)
    assert isinstance(res.exception, UsageError), res.output
    assert "--rules-tests-out needs --rules-out" in str(res.exception)
    assert not (tmp_path / "t.yml").exists()

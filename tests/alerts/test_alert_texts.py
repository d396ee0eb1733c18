"""The words and the inhibition of the generated alerts (issue 29): every rule has a summary and
a description naming the node (and the GPU), the promtool cases pin the rendered text of each,
and the Alertmanager inhibition holds back the generic alert, never the specific one."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.cli.config_alertmanager import INHIBIT_RULES
from gpufleet.cli.config_prometheus import ALERT_RULES, GPU_RULES, rules_doc
from gpufleet.cli.prometheus_rule_tests import HOST, rule_tests_doc
from tests.agent.conftest import need_binary

GPU_ALERTS = {str(r["alert"]) for r in GPU_RULES}


def _annotations(rule: dict[str, object]) -> dict[str, str]:
    annotations = rule["annotations"]
    assert isinstance(annotations, dict)
    return annotations


def test_every_rule_has_a_summary_and_description_naming_its_node_and_gpu() -> None:
    for rule in ALERT_RULES:
        name = str(rule["alert"])
        texts = _annotations(rule)
        assert set(texts) == {"summary", "description"}, name
        # `up` carries the scrape's labels only: the agent's address names the node there
        node = "$labels.instance" if name == "GpufleetAgentDown" else "$labels.Hostname"
        for key in ("summary", "description"):
            assert texts[key].strip(), (name, key)
            assert node in texts[key], (name, key)
            if name in GPU_ALERTS:
                assert "$labels.gpu" in texts[key], (name, key)


def _firing_cases() -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for group in rule_tests_doc()["tests"]:
        for check in group["alert_rule_test"]:
            out.setdefault(check["alertname"], []).extend(check["exp_alerts"])
    return out


# the words each alert's rendered description must hold besides the node and the GPU
CODES = {
    "GpufleetGpuLost": ["GPU_LOST", "XID 79"],
    "GpufleetGpuFailed": ["fail", "XID_48", "GPU_LOST"],
    "GpufleetGpuWarning": ["warn", "HW_THERMAL_SLOWDOWN"],
    "GpufleetXidErrors": ["XID_79", "GPU has fallen off the bus", "reboot the node", "XID_13"],
    "GpuRowRemapFailure": ["ROW_REMAP_FAILURE"],
    "GpuHotAndThrottled": ["HW_THERMAL_SLOWDOWN", "91 C"],
    "GpufleetNodeGpusLost": ["GPU_LOST", "GPU 0 GPU 3"],
    "GpufleetNodeFailed": ["fail", "GPU 3"],
}


def test_the_promtool_cases_pin_the_rendered_words_of_every_alert() -> None:
    """promtool compares the annotations exactly, so these cases are the rendered text; they
    name the node, the GPU and the finding code (issue 29: "GPU 1 on pa warns", no
    description)."""
    cases = _firing_cases()
    assert set(cases) == {str(r["alert"]) for r in ALERT_RULES}
    for name, alerts in cases.items():
        assert alerts, name
        descriptions = " | ".join(a["exp_annotations"]["description"] for a in alerts)
        for alert in alerts:
            texts = alert["exp_annotations"]
            assert set(texts) == {"summary", "description"}, name
            node = "node-a:9400" if name == "GpufleetAgentDown" else HOST
            assert all(node in texts[k] for k in texts), (name, texts)
            if name in GPU_ALERTS:
                gpu = f"GPU {alert['exp_labels']['gpu']}"
                assert all(gpu in texts[k] for k in texts), (name, texts)
        for word in CODES.get(name, []):
            assert word in descriptions, (name, word, descriptions)


@pytest.mark.process
def test_promtool_check_rules_accepts_the_templates(tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules_doc(), sort_keys=False), encoding="utf-8")
    out = subprocess.run(
        [need_binary("promtool"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


_MATCHER = re.compile(r'^(\w+)(=~|=)"(.*)"$')


def _matches(matchers: list[str], labels: dict[str, str]) -> bool:
    for m in matchers:
        found = _MATCHER.match(m)
        assert found, m
        name, op, value = found.groups()
        got = labels.get(name, "")
        if not (re.fullmatch(value, got) if op == "=~" else got == value):
            return False
    return True


def _alerts() -> list[dict[str, str]]:
    """The label sets of every alert the rules raise (XID errors in both severities), for
    one GPU of one node."""
    out = []
    for rule in ALERT_RULES:
        labels = rule["labels"]
        assert isinstance(labels, dict)
        name = str(rule["alert"])
        severities = ["critical", "warning"] if "{{" in labels["severity"] else [labels["severity"]]
        for severity in severities:
            out.append({"alertname": name, "scope": labels["scope"], "severity": severity})
    return out


def _holds_back() -> set[tuple[tuple[str, str], tuple[str, str]]]:
    """(source, target) pairs of (alertname, severity): which alert holds back which."""
    pairs = set()
    for rule in INHIBIT_RULES:
        for src in _alerts():
            if not _matches(rule["source_matchers"], src):  # type: ignore[arg-type]
                continue
            for dst in _alerts():
                if dst != src and _matches(rule["target_matchers"], dst):  # type: ignore[arg-type]
                    pairs.add(
                        ((src["alertname"], src["severity"]), (dst["alertname"], dst["severity"]))
                    )
    return pairs


def test_the_specific_alert_holds_back_the_generic_one_never_the_other_way() -> None:
    pairs = _holds_back()
    names = {(s[0], d[0]) for s, d in pairs}
    for specific in ("GpufleetGpuLost", "GpuRowRemapFailure"):
        assert (specific, "GpufleetGpuFailed") in names
        assert (specific, "GpufleetGpuWarning") in names
    assert (("GpufleetXidErrors", "critical"), ("GpufleetGpuFailed", "critical")) in pairs
    assert (("GpufleetXidErrors", "warning"), ("GpufleetGpuWarning", "warning")) in pairs
    assert ("GpufleetGpuLost", "GpufleetNodeFailed") in names
    assert ("GpufleetAgentDown", "GpufleetGpuLost") in names
    # never the other way: a verdict alert holds back no finding alert, and no pair both ways
    for generic in ("GpufleetGpuFailed", "GpufleetGpuWarning", "GpufleetNodeFailed"):
        assert not {d for s, d in names if s == generic} & {
            "GpufleetGpuLost",
            "GpuRowRemapFailure",
            "GpufleetXidErrors",
            "GpuHotAndThrottled",
            "GpufleetNodeGpusLost",
        }, generic
    assert not {(d, s) for s, d in pairs} & pairs
    # a warning never holds back a critical alert: the page would leave the pager
    assert not [(s, d) for s, d in pairs if s[1] == "warning" and d[1] == "critical"]

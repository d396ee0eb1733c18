"""A power order's body (`gpufleet.control.power.spec`): one form or the other, never a
whole-fleet order by accident, selectors that all must match, durations, and the CLI's errors
for bad input (no traceback, the option named)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from gpufleet.control.power.spec import PowerOrderSpec, matches, parse_duration
from gpufleet.errors import UsageError


def test_an_order_needs_a_selector_or_a_plan() -> None:
    with pytest.raises(ValidationError, match="give a selector"):
        PowerOrderSpec(limit_w=500)
    with pytest.raises(ValidationError, match="limit_w"):
        PowerOrderSpec(nodes=["a"])
    with pytest.raises(ValidationError, match="whole plan"):
        PowerOrderSpec(per_node={"a": {"0": 500}}, limit_w=500)
    with pytest.raises(ValidationError, match="not a GPU index"):
        PowerOrderSpec(per_node={"a": {"x": 500}})
    with pytest.raises(ValidationError):
        PowerOrderSpec(limit_w=0, nodes=["a"])


def test_every_selector_given_must_match() -> None:
    spec = PowerOrderSpec(limit_w=500, tenant="acme", labels={"role": "train"})
    assert matches(spec, "a", "acme", {"role": "train"})
    assert not matches(spec, "a", None, {"role": "train"})
    assert not matches(spec, "a", "acme", {"role": "infer"})
    part = PowerOrderSpec(limit_w=500, partition="batch")
    assert matches(part, "a", None, {"partition": "batch"})
    assert not matches(part, "a", None, {})
    assert PowerOrderSpec(limit_w=500, nodes=["a"], gpus=[1, 0]).limits_for("a") == {
        "0": 500,
        "1": 500,
    }
    assert PowerOrderSpec(limit_w=500, nodes=["a"]).limits_for("a") == {"*": 500}


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("30m", 1800), ("8h", 28800), ("2d", 172800), ("15", 15)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "-1h", "0s", "100d", "soon"])
def test_bad_durations_name_the_option(text: str) -> None:
    with pytest.raises(UsageError, match="--revert-after"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--limit", "500", "--controller", "http://127.0.0.1:9", "--token", "t"], "a target"),
        (["--limit", "500", "--label", "role=x"], "need --controller"),
        (
            [
                *("--limit", "500", "--controller", "http://127.0.0.1:9", "--token", "t"),
                *("--label", "x"),
            ],
            "KEY=VALUE",
        ),
        (
            [
                *("--limit", "500", "--controller", "http://127.0.0.1:9", "--token", "t"),
                *("--nodes", "a", "--revert-after", "soon"),
            ],
            "--revert-after",
        ),
    ],
)
@pytest.mark.process
def test_cli_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet", "power", "apply", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr

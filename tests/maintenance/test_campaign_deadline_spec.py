"""The drain deadline's fields of a campaign spec (issue 15): defaults, the rule that the
deadline comes before the drain timeout, and a checkpoint signal a job can trap."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpufleet.control.campaigns.engine import CampaignSpec

BASE: dict[str, Any] = {
    "baseline": {"models": {"h100-sxm": {"driver": "550.90.07"}}},
    "update_command": "/usr/local/sbin/site-update",
}


def test_defaults_signal_usr1_with_slurms_60_s_grace_before_the_timeout() -> None:
    s = CampaignSpec.model_validate(BASE)
    assert (s.drain_deadline_s, s.checkpoint_signal, s.checkpoint_grace_s) == (1800, "USR1", 60)
    assert s.drain_deadline_s is not None and s.drain_deadline_s < s.drain_timeout_s


def test_a_short_timeout_moves_the_default_deadline_to_half_of_it() -> None:
    s = CampaignSpec.model_validate({**BASE, "drain_timeout_s": 600})
    assert s.drain_deadline_s == 300
    again = CampaignSpec.model_validate(s.model_dump(mode="json"))  # as stored, read back
    assert again.drain_deadline_s == 300


def test_a_deadline_after_the_timeout_is_refused_naming_both() -> None:
    with pytest.raises(ValidationError, match=r"drain_deadline_s .*drain_timeout_s"):
        CampaignSpec.model_validate({**BASE, "drain_timeout_s": 600, "drain_deadline_s": 900})


def test_no_deadline_and_bad_signals() -> None:
    assert CampaignSpec.model_validate({**BASE, "drain_deadline_s": None}).drain_deadline_s is None
    for bad in ("KILL", "SIGSTOP", "USR9", "usr1"):
        with pytest.raises(ValidationError, match="checkpoint_signal"):
            CampaignSpec.model_validate({**BASE, "checkpoint_signal": bad})
    assert CampaignSpec.model_validate({**BASE, "checkpoint_signal": "SIGTERM"})

"""The recurring maintenance policy at work (issue 15): on the controller's loop, when the
policy's next occurrence opens within ``propose_days_before`` and some node is out of
baseline, propose a campaign (state ``proposed``) over those nodes. Nothing starts by
itself: an operator starts the proposal (``gpufleet maintenance start --proposal ID`` or the
dashboard's button), or aborts it to dismiss it.

One proposal per occurrence: its ``created_by`` is ``policy:maintenance@<occurrence start,
UTC ISO 8601>``, so a controller restarted, or a proposal dismissed, never brings the same
one back. No proposal is made while another one waits or a campaign runs or is paused.
"""

from __future__ import annotations

import weakref
from datetime import timedelta
from typing import Any

from sqlalchemy import select

from gpufleet.control.campaigns import engine as cp
from gpufleet.control.campaigns.ops import _members, _start, live_campaign
from gpufleet.control.db.models import MaintCampaign
from gpufleet.control.state.store import ControlStore
from gpufleet.maintenance.recurring import MaintenancePolicy, utc

CHECK_EVERY_S = 30.0  # the drift check reads every node's GPUs: not on every tick
# per store: (time of the last check, the policy and fleet size it saw); a new policy or a
# node joining or leaving checks again at once
_last: weakref.WeakKeyDictionary[ControlStore, tuple[float, int, int]] = weakref.WeakKeyDictionary()


def next_occurrence(policy: MaintenancePolicy, now_s: float) -> dict[str, Any]:
    """The next occurrence and when its proposal is due (the dashboard shows it)."""
    start, end = policy.next_occurrence(utc(now_s))
    due = start - timedelta(days=policy.propose_days_before)
    return {
        "start": start.isoformat(),
        "end": end.isoformat(),
        "propose_from": due.isoformat(),
        "every": policy.every,
        "on": policy.on,
        "window": policy.window,
    }


def occurrence_key(start_iso: str) -> str:
    return f"policy:maintenance@{start_iso}"


def propose(store: ControlStore, *, force: bool = False) -> int | None:
    """A proposal when one is due (a writer command); its id, else None."""
    policy = store.policy.maintenance
    now_s = store.clock()
    if policy is None:
        return None
    seen = (id(policy), len(store.nodes))
    last = _last.get(store)
    if not force and last is not None and last[1:] == seen and now_s - last[0] < CHECK_EVERY_S:
        return None
    _last[store] = (now_s, *seen)
    start, _end = policy.next_occurrence(utc(now_s))
    if utc(now_s) < start - timedelta(days=policy.propose_days_before):
        return None
    key = occurrence_key(start.isoformat())
    with store.sessions() as s:
        if live_campaign(s) is not None:
            return None
        waiting = select(MaintCampaign.id).where(
            (MaintCampaign.state == cp.PROPOSED) | (MaintCampaign.created_by == key)
        )
        if s.scalars(waiting).first() is not None:
            return None
    spec = cp.CampaignSpec.model_validate(policy.spec_body(len(store.nodes)))
    members, _skipped = _members(store, spec)
    if not members:
        return None
    cid = _start(store, spec, None, state=cp.PROPOSED, created_by=key)
    store.bump()
    return cid


def tick(store: ControlStore) -> int | None:
    """`propose` on the writer (from the controller's loop thread)."""
    if store.policy.maintenance is None:
        return None
    return store.writer.call(lambda: propose(store))

"""Posting a result the agent keeps on disk (an update's, a power order's) to the controller,
once: the answer decides whether the key is done or is tried again before the next batch."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
from pydantic import BaseModel

from gpufleet.agent.update_unit import write_private

log = logging.getLogger("gpufleet.agent")


def post_report(
    client: httpx.Client,
    url: str,
    headers: dict[str, str],
    report: BaseModel,
    reported: Path,
    what: str,
) -> bool:
    """POST ``report``; True when the controller answered for good (taken, or refused with a
    4xx: sending it again would be refused again), recorded in ``reported`` (0600); False when
    it should be tried again (no answer, or a 5xx)."""
    key = getattr(report, "key", "?")
    try:
        r = client.post(url, json=report.model_dump(mode="json"), headers=headers)
    except httpx.HTTPError as exc:
        log.info("%s: report of %s not sent (%s); retrying", what, key, exc)
        return False
    if r.status_code >= 500:
        return False
    if r.status_code >= 400:
        log.warning("%s: report of %s refused: %s", what, key, r.text[:200])
    write_private(reported, {"status": r.status_code})
    return True

"""The queue: which waiting job goes next, and per-tenant GPU quotas.

Order: higher ``priority`` first, then earlier submission. A tenant at its quota (GPUs in use plus
this job's GPUs over the limit) waits; jobs of other tenants go ahead. A job that does not fit the
free GPUs now does not block smaller jobs behind it (greedy backfill without reservations: a very
large job can wait long on a busy fleet; raise its priority and it is tried first every tick).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueEntry:
    """What the queue needs to know of a waiting job."""

    job_id: str
    tenant: str
    priority: int
    seq: int  # submission order
    gpus_total: int
    not_before_s: float = 0.0  # a requeued job waits until its old copy is surely fenced


def ordered(entries: Iterable[QueueEntry]) -> list[QueueEntry]:
    """Waiting jobs in the order they are tried: priority descending, then FIFO."""
    return sorted(entries, key=lambda e: (-e.priority, e.seq))


class Quotas:
    """Per-tenant limits on GPUs in use at once (no entry: unlimited)."""

    def __init__(self, limits: Mapping[str, int] | None = None) -> None:
        self.limits: dict[str, int] = dict(limits or {})

    def allows(self, tenant: str, in_use: int, wanted: int) -> bool:
        limit = self.limits.get(tenant)
        return limit is None or in_use + wanted <= limit

    def exceeds_alone(self, tenant: str, wanted: int) -> bool:
        """True when the job could never start: it alone asks more than the tenant's quota."""
        limit = self.limits.get(tenant)
        return limit is not None and wanted > limit

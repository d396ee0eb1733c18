"""NVLink peer-to-peer judging with per-GPU and per-link evidence.

A slow NVLink of one GPU slows every copy that GPU takes part in, so each of its peers sees one
slow pair; a figure like "the slowest pair of each GPU" then drops on all eight GPUs of the
node and makes all of them look like stragglers. The judge here attributes instead:

1. From the bandwidth matrix (`gpufleet.validate.analysis.analyse_pairs`): a GPU whose median
   pair is below the pass line is the bad GPU; else single pairs below it are bad pairs.
2. A peer's slowest pair leaves out the pairs with a GPU (or the pairs) so attributed: one bad
   GPU flags that GPU alone.
3. NVLink error counters read before and after the test (NVML ``NVML_FI_DEV_NVLINK_ERROR_DL_CRC``
   / ``_REPLAY`` / ``_RECOVERY`` field values and the link state, per link: `NvLinkCounters`)
   name the link: a counter that rose during the test, or a link that is down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.devices.types import NvLinkCounters, Sample
from gpufleet.validate import thresholds as th
from gpufleet.validate.analysis import analyse_pairs
from gpufleet.validate.results import Metric, Status, TestResult


@dataclass(frozen=True)
class LinkErrors:
    """What one NVLink of one GPU did during the peer-to-peer test (None: not reported)."""

    link: int
    crc: int | None = None
    replay: int | None = None
    recovery: int | None = None
    down: bool = False

    @property
    def bad(self) -> bool:
        return self.down or any((self.crc, self.replay, self.recovery))

    def describe(self) -> str:
        if self.down:
            return f"NVLink {self.link} down"
        parts = [
            f"{n} {word}"
            for n, word in (
                (self.crc, "CRC error(s)"),
                (self.replay, "replay(s)"),
                (self.recovery, "recovery error(s)"),
            )
            if n
        ]
        return f"NVLink {self.link}: {', '.join(parts)} during the test"

    def as_dict(self) -> dict[str, Any]:
        return {
            "link": self.link,
            "crc_errors": self.crc,
            "replay_errors": self.replay,
            "recovery_errors": self.recovery,
            "down": self.down,
        }


def _rise(before: int | None, after: int | None) -> int | None:
    if before is None or after is None:
        return None
    return max(0, after - before)


def link_errors(before: Sample | None, after: Sample | None) -> list[LinkErrors]:
    """The links of one GPU that had errors or were down during the test (from two slow-tier
    samples); empty where NVML reports no per-link counters."""
    if after is None or not after.nvlink_links:
        return []
    old: dict[int, NvLinkCounters] = {
        c.link: c for c in (before.nvlink_links or () if before is not None else ())
    }
    any_up = any(c.active for c in after.nvlink_links)
    out = []
    for c in after.nvlink_links:
        b = old.get(c.link)
        e = LinkErrors(
            c.link,
            _rise(b.crc_errors if b else None, c.crc_errors),
            _rise(b.replay_errors if b else None, c.replay_errors),
            _rise(b.recovery_errors if b else None, c.recovery_errors),
            down=any_up and c.active is False,
        )
        if e.bad:
            out.append(e)
    return out


def _median(vals: list[float]) -> float:
    s = sorted(vals)
    return s[len(s) // 2] if s else 0.0


def nvlink_pairs(
    node: str,
    matrix: dict[int, dict[int, float]],
    expected: float | None,
    thr: th.Thresholds,
    errors: Mapping[int, list[LinkErrors]] | None = None,
) -> list[TestResult]:
    """NVLink peer-to-peer results from a GPU x GPU bandwidth matrix (GB/s, one direction, the
    slower of the two) and, where read, each GPU's link errors during the test: one result per
    GPU (a GPU whose median pair is below the pass line is the bad one, with the links that had
    errors named), one per bad pair otherwise (as the node pairwise test attributes links)."""
    errors = errors or {}
    lim = thr.limits("nvlink_p2p")
    named = {f"gpu{a}": {f"gpu{b}": v for b, v in row_.items()} for a, row_ in matrix.items()}
    verdict = analyse_pairs(named, expected or 0.0, lim.pass_fraction) if expected else None
    bad_gpus = {int(n[3:]) for n in verdict.bad_nodes} if verdict else set()
    bad_pairs = (
        {frozenset(int(x[3:]) for x in link.split("<->")) for link in (verdict.bad_links or ())}
        if verdict
        else set()
    )
    out: list[TestResult] = []
    for a in sorted(matrix):
        peers = {b: v for b, v in matrix[a].items() if b != a}
        med = _median(list(peers.values()))
        # the slowest pair not already explained by another GPU or a named bad pair
        own = {
            b: v
            for b, v in peers.items()
            if a in bad_gpus or (b not in bad_gpus and frozenset((a, b)) not in bad_pairs)
        }
        low = min(own.values()) if own else None
        m = thr.judge("nvlink_p2p", "median_pair", med, expected, "GB/s")
        mine = errors.get(a, [])
        said = "; ".join(e.describe() for e in mine)
        if a in bad_gpus:
            m.status = Status.FAIL
            where = said or "no NVLink error counter rose (see `health` nvlink findings)"
            msg = (
                f"every NVLink peer copy of GPU {a} is slow: median {med:.1f} GB/s, expected "
                f"{expected or 0:.1f} GB/s; {where}"
            )
        else:
            msg = f"median peer copy {med:.1f} GB/s over {len(peers)} peers"
            if low is not None:
                msg += f", slowest {low:.1f} GB/s"
            if said:
                msg += f"; {said}"
        metrics = [m] + ([Metric("min_pair", low, "GB/s")] if low is not None else [])
        details: dict[str, Any] = {"pairs_gbps": {str(b): round(v, 2) for b, v in peers.items()}}
        if mine:
            details["links"] = [e.link for e in mine]
            details["link_errors"] = [e.as_dict() for e in mine]
        left_out = sorted(set(peers) - set(own))
        if left_out:
            details["min_pair_leaves_out"] = left_out
        out.append(
            TestResult("nvlink_p2p", node, m.status, msg, gpu=a, metrics=metrics, details=details)
        )
    for link in verdict.bad_links if verdict else ():
        ga, gb = (int(x[3:]) for x in link.split("<->"))
        v = matrix[ga][gb]
        exp = expected or 0.0
        m = Metric("bandwidth", v, "GB/s", exp, lim.pass_fraction * exp, Status.FAIL)
        said = "; ".join(f"GPU {g} {e.describe()}" for g in (ga, gb) for e in errors.get(g, []))
        out.append(
            TestResult(
                "nvlink_p2p",
                node,
                Status.FAIL,
                f"GPU {ga} <-> GPU {gb} at {v:.1f} GB/s, expected {exp:.1f} GB/s"
                + (f"; {said}" if said else ""),
                link=f"{node}/gpu{ga}<->{node}/gpu{gb}",
                metrics=[m],
            )
        )
    return out

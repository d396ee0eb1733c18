"""Fleet analysis: stragglers by robust z-score among peers of the same model.

Modified z-score (Iglewicz & Hoaglin, 1993, "How to Detect and Handle Outliers", ASQC Basic
References in Quality Control vol. 16): ``z = 0.6745 (x - median) / MAD`` where MAD is the
median absolute deviation; ``|z| > 3.5`` marks a potential outlier. Only the bad side counts
(a GPU faster than its peers is not a straggler), and a straggler must also be at least
``min_deviation`` (5 %) from the median: on a uniform fleet the MAD is tiny and a 1-2 %
difference reaches any z-score, yet it is inside the band the pass lines already accept (a
figure passes without a warning at >= 0.95 of its expected value), so it does not matter.

Stragglers are reported per component: one line per GPU (or node) with its worst figure and
the others listed under ``also``, so a slow GPU is one line, not one per precision.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from gpufleet.validate.results import Straggler, TestResult

MAD_SCALE = 0.6745  # Iglewicz & Hoaglin: 0.6745 = Phi^-1(0.75), makes MAD comparable to sigma
MIN_PEERS = 5  # fewer peers than this: no robust statistics


@dataclass(frozen=True)
class Observation:
    """One figure of one component."""

    test: str
    metric: str
    component: str
    model: str
    value: float


def robust_z(values: list[float]) -> tuple[float, float, list[float]]:
    """Median, MAD and the modified z-score of each value.

    Where MAD is 0 (more than half the values equal), the mean absolute deviation scaled by
    1.253314 stands in for MAD / 0.6745 (the usual fallback; IBM SPSS "modified z-score");
    where that is 0 too, every value equals the median and every z is 0.
    """
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    if mad > 0:
        return med, mad, [MAD_SCALE * (v - med) / mad for v in values]
    mean_ad = statistics.fmean(abs(v - med) for v in values)
    if mean_ad == 0:
        return med, mad, [0.0 for _ in values]
    return med, mad, [(v - med) / (1.253314 * mean_ad) for v in values]


def find_stragglers(
    observations: list[Observation],
    z_cut: float = 3.5,
    min_deviation: float = 0.05,
    higher_is_better: bool = True,
) -> list[Straggler]:
    """Stragglers among observations grouped by (test, metric, model), one per component."""
    groups: dict[tuple[str, str, str], list[Observation]] = defaultdict(list)
    for o in observations:
        groups[(o.test, o.metric, o.model)].append(o)
    hits: dict[str, list[Straggler]] = defaultdict(list)
    for (test, metric, model), obs in sorted(groups.items()):
        if len(obs) < MIN_PEERS:
            continue
        med, mad, zs = robust_z([o.value for o in obs])
        if med == 0:
            continue
        for o, z in zip(obs, zs, strict=True):
            dev = (o.value - med) / abs(med)
            bad = z < -z_cut if higher_is_better else z > z_cut
            far = -dev >= min_deviation if higher_is_better else dev >= min_deviation
            if bad and far:
                hits[o.component].append(
                    Straggler(
                        test=test,
                        metric=metric,
                        component=o.component,
                        model=model,
                        value=o.value,
                        median=med,
                        mad=mad,
                        z=z,
                        deviation_pct=100.0 * dev,
                    )
                )
    out: list[Straggler] = []
    for found in hits.values():
        found.sort(key=lambda s: -abs(s.deviation_pct))
        head, rest = found[0], found[1:]
        head.also.extend(
            f"{s.test}/{s.metric} {s.deviation_pct:+.1f} % (z {s.z:.1f})" for s in rest
        )
        out.append(head)
    return sorted(out, key=lambda s: (s.deviation_pct, s.component))


def observations_from(results: list[TestResult], models: dict[str, str]) -> list[Observation]:
    """Every metric of every result, with the model of its component (``models``: component ->
    catalog key; components without a model are grouped under "unknown")."""
    obs: list[Observation] = []
    for r in results:
        if r.link is not None:
            continue  # links are analysed with the pair matrix
        model = models.get(r.component, "unknown")
        for m in r.metrics:
            obs.append(Observation(r.test, m.name, r.component, model, m.value))
    return obs


@dataclass(frozen=True)
class PairVerdict:
    """What the pairwise matrix says: bad nodes (all their links slow) and bad single links."""

    bad_nodes: tuple[str, ...]
    bad_links: tuple[str, ...]


def analyse_pairs(
    matrix: dict[str, dict[str, float]], expected_gbps: float, pass_fraction: float = 0.9
) -> PairVerdict:
    """A node whose median link is below the pass line is bad; otherwise single links below the
    line (or robust-z stragglers among all links) are bad links."""
    nodes = sorted(matrix)
    line = expected_gbps * pass_fraction
    bad_nodes = []
    for n in nodes:
        vals = [v for peer, v in matrix[n].items() if peer != n]
        if vals and statistics.median(vals) < line:
            bad_nodes.append(n)
    links: list[tuple[str, float]] = []
    for i, a in enumerate(nodes):
        for b in nodes[i + 1 :]:
            if a in bad_nodes or b in bad_nodes or b not in matrix[a]:
                continue
            links.append((f"{a}<->{b}", matrix[a][b]))
    bad_links = [name for name, v in links if v < line]
    if len(links) >= MIN_PEERS:
        med, _mad, zs = robust_z([v for _, v in links])
        for (name, v), z in zip(links, zs, strict=True):
            if z < -3.5 and (med - v) / med >= 0.03 and name not in bad_links:
                bad_links.append(name)
    return PairVerdict(tuple(bad_nodes), tuple(sorted(bad_links)))

"""Reads sized for fleets of thousands of nodes, for the dashboard: the heatmap folded into one
tile per rack or model when the selection has more GPU cells than the page can draw (each
group with counts by state and health and the metric's min/mean/max, so the worst node still
shows), and the node list searched, sorted and paged on the server (the page asks for 100 rows,
never for 10,000 nodes with their GPUs)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gpufleet.control.fleet import queries as qy
from gpufleet.control.state.lifecycle import OUT_STATES, NodeState
from gpufleet.control.state.store import ControlStore, NodeView
from gpufleet.wire import views as sc

GROUP_BY = ("rack", "model")
NODE_SORTS = (
    "name",
    "state",
    "health",
    "rack",
    "model",
    "findings",
    "util",
    "power",
    "temp",
    "seen",
    "attention",
)
# worst first: fail, then unknown (a lost node: nothing is known now), then warn, then ok
HEALTH_RANK = {2: 0, 3: 1, 1: 2, 0: 3}
Mat = npt.NDArray[np.float64]


def shown_health(nc: NodeView) -> int:
    """The health to count and sort by: unknown (3) for a lost node (its last report is
    history), as the summary and the heatmap count it."""
    return 3 if nc.state == NodeState.LOST else nc.health


def group_key(nc: NodeView, by: str) -> str | None:
    return nc.rack if by == "rack" else nc.model


def _width(nc: NodeView) -> int:
    """A node's heatmap cells: one per GPU index up to its highest."""
    return (max(nc.gpus) + 1) if nc.gpus else 0


def cells(
    store: ControlStore, nodes: Sequence[NodeView], widths: Sequence[int], metric: str
) -> Mat:
    """The heatmap cells of ``nodes`` (``widths``: each one's `_width`) as an array (nodes,
    widest node) of float64, NaN for no data and past a node's own width: the same values as
    `queries.heatmap_row`, read with one lock for the whole selection."""
    if metric == "health":
        out = np.full((len(nodes), max(widths, default=0)), np.nan)
        for i, nc in enumerate(nodes):
            row = qy.heatmap_row(store, nc, metric)
            out[i, : len(row)] = row
        return out
    pairs = [(n.name, w) for n, w in zip(nodes, widths, strict=True)]
    field = "power_w" if metric == "power_pct" else metric
    got = store.telemetry.latest_many(pairs, [field], stale_s=qy.STALE_GPU_S)[:, :, 0]
    vals = got.astype(np.float64)
    if metric == "power_pct":
        limits = np.full(vals.shape, np.nan)
        for i, nc in enumerate(nodes):
            for j, g in nc.gpus.items():
                if g.power_limit_w:
                    limits[i, j] = g.power_limit_w
        vals = 100.0 * vals / limits
    return vals


def _rows(vals: Mat, widths: Sequence[int]) -> list[list[float | None]]:
    return [
        [None if math.isnan(v) else v for v in row[:w]]
        for row, w in zip(vals.tolist(), widths, strict=True)
    ]


def heatmap(
    store: ControlStore,
    nodes: list[NodeView],
    metric: str,
    *,
    group_by: str | None,
    max_cells: int | None,
    expand: Sequence[str],
) -> sc.Heatmap:
    """The ``/heatmap`` answer: every node's row as before, unless ``group_by`` is given and
    the selection has more than ``max_cells`` GPU cells (None: always group), in which case
    one group per rack or model and rows only for the groups named in ``expand`` ("" names
    the group of nodes without a rack or model)."""
    widths = [_width(n) for n in nodes]
    if group_by is None or (max_cells is not None and sum(widths) <= max_cells):
        vals = cells(store, nodes, widths, metric)
        return qy.heatmap(store, nodes, metric, values=_rows(vals, widths))
    if not nodes:
        return qy.heatmap(store, [], metric, values=[], group_by=group_by, groups=[])
    members: dict[str | None, list[tuple[NodeView, int]]] = {}
    for nc, w in zip(nodes, widths, strict=True):
        members.setdefault(group_key(nc, group_by), []).append((nc, w))
    keys = sorted(members, key=lambda k: (k is None, k or ""))
    ordered = [nw for k in keys for nw in members[k]]
    vals = cells(store, [n for n, _ in ordered], [w for _, w in ordered], metric)
    if not vals.shape[1]:  # no node has a GPU (or none is selected): nothing to reduce
        vals = np.full((len(ordered), 1), np.nan)
    valid = ~np.isnan(vals)
    starts = np.cumsum([0] + [len(members[k]) for k in keys[:-1]])
    stats = {
        "min": np.fmin.reduceat(np.fmin.reduce(vals, axis=1), starts),
        "max": np.fmax.reduceat(np.fmax.reduce(vals, axis=1), starts),
        "sum": np.add.reduceat(np.where(valid, vals, 0.0).sum(axis=1), starts),
        "have": np.add.reduceat(valid.sum(axis=1), starts),
    }
    wanted = set(expand)
    groups: list[sc.HeatmapGroup] = []
    rows: list[tuple[NodeView, int]] = []
    row_vals: list[Mat] = []
    for gi, key in enumerate(keys):
        grp = members[key]
        a = int(starts[gi])
        if (key or "") in wanted:
            rows.extend(grp)
            row_vals.append(vals[a : a + len(grp)])
        have = int(stats["have"][gi])
        groups.append(
            _group(
                key,
                grp,
                have=have,
                lo=float(stats["min"][gi]) if have else None,
                hi=float(stats["max"][gi]) if have else None,
                mean=float(stats["sum"][gi]) / have if have else None,
            )
        )
    picked = np.concatenate(row_vals) if row_vals else np.zeros((0, 0))
    return qy.heatmap(
        store,
        [n for n, _ in rows],
        metric,
        values=_rows(picked, [w for _, w in rows]),
        group_by=group_by,
        groups=groups,
    )


def _group(
    key: str | None,
    members: list[tuple[NodeView, int]],
    *,
    have: int,
    lo: float | None,
    hi: float | None,
    mean: float | None,
) -> sc.HeatmapGroup:
    nodes = [n for n, _ in members]
    health = Counter(shown_health(n) for n in nodes)
    cells_n = sum(w for _, w in members)
    worst = min(health, key=lambda h: HEALTH_RANK.get(h, 3))
    return sc.HeatmapGroup(
        key=key,
        nodes=len(nodes),
        gpus=cells_n,
        by_state=dict(Counter(n.state for n in nodes)),
        by_health={w: health.get(k, 0) for k, w in qy.HEALTH_WORDS.items()},
        worst_health=worst,
        out=sum(1 for n in nodes if n.state in OUT_STATES),
        cordoned=sum(1 for n in nodes if n.cordoned),
        min=lo,
        mean=mean,
        max=hi,
        no_data=cells_n - have,
    )


def needs_attention(nc: NodeView) -> bool:
    """Not in service, not healthy, or cordoned: the overview's "Needs attention" list."""
    return nc.state != NodeState.IN_SERVICE or nc.health != 0 or nc.cordoned


def search(nodes: list[NodeView], q: str) -> list[NodeView]:
    """Nodes whose name, rack or state contains ``q`` (case-insensitive)."""
    q = q.lower()
    return [
        n
        for n in nodes
        if q in n.name.lower() or q in (n.rack or "").lower() or q in n.state.lower()
    ]


def figures(store: ControlStore, nodes: Sequence[NodeView]) -> dict[str, list[float | None]]:
    """Per node: mean utilisation, total power and hottest GPU of its newest samples (the
    nodes table's columns; None without samples)."""
    got = store.telemetry.latest_many(
        [(n.name, _width(n)) for n in nodes], ["gpu_util_pct", "power_w", "gpu_temp_c"]
    ).astype(np.float64)
    have = (~np.isnan(got)).sum(axis=1)  # (nodes, 3)
    with np.errstate(invalid="ignore", divide="ignore"):
        util = np.nansum(got[:, :, 0], axis=1) / have[:, 0]
    power = np.nansum(got[:, :, 1], axis=1)
    temp = np.fmax.reduce(got[:, :, 2], axis=1) if got.shape[1] else np.full(len(nodes), np.nan)
    out: dict[str, list[float | None]] = {}
    for i, n in enumerate(nodes):
        out[n.name] = [
            float(util[i]) if have[i, 0] else None,
            float(power[i]) if have[i, 1] else None,
            float(temp[i]) if have[i, 2] else None,
        ]
    return out


def _sort_key(store: ControlStore, nodes: list[NodeView], key: str) -> Callable[[NodeView], Any]:
    if key in ("util", "power", "temp"):
        col = ("util", "power", "temp").index(key)
        figs = figures(store, nodes)

        def figure(n: NodeView) -> Any:
            return figs[n.name][col]

        return figure
    keys: dict[str, Callable[[NodeView], Any]] = {
        "name": lambda n: n.name,
        "state": lambda n: n.state,
        "health": shown_health,
        "rack": lambda n: n.rack or "",
        "model": lambda n: n.model or "",
        "findings": lambda n: len(n.findings),
        "seen": lambda n: n.last_seen_s or 0.0,
    }
    return keys[key]


def sort_nodes(store: ControlStore, nodes: list[NodeView], key: str, desc: bool) -> list[NodeView]:
    """``nodes`` ordered by ``key`` (one of NODE_SORTS), ties by name; a node without the
    figure (no samples) comes last either way. ``attention``: fail, unknown, warn, ok, then by
    state and name (``desc`` ignored)."""
    if key == "attention":
        return sorted(nodes, key=lambda n: (HEALTH_RANK.get(shown_health(n), 3), n.state, n.name))
    fig = _sort_key(store, nodes, key)
    have = [n for n in nodes if fig(n) is not None]
    none = [n for n in nodes if fig(n) is None]
    have.sort(key=lambda n: n.name)  # stable sorts: ties stay by name
    have.sort(key=fig, reverse=desc)
    return have + none

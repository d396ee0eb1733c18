"""`gpufleet inventory --baseline FILE`: the nodes out of baseline and which field differs on
which GPU, from a simulated fleet (``--sim``), nvidia-smi reports (``--import``), this host,
or what a controller's agents last reported (``--controller``). The matching is the
maintenance planner's (`gpufleet.maintenance.baseline`): a version not reported is unknown
and never matches."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from rich.table import Table

from gpufleet.cli.output import console, emit_json, fit
from gpufleet.maintenance.baseline import (
    BaselineFile,
    NodeBaseline,
    check_fleet,
    check_versions,
    load_baseline,
)

PAGE = 1000  # GPUs per request to the controller (its `/gpus` limit)


def controller_status(
    controller: str, token: str | None, baseline: BaselineFile
) -> list[NodeBaseline]:
    """Every node the token sees, from the GPU versions its agent last reported."""
    from gpufleet.cli import remote

    rows: list[dict[str, Any]] = []
    with remote.client(controller, token) as client:
        while True:
            page = client.request("GET", "/gpus", params={"limit": PAGE, "offset": len(rows)})
            rows.extend(page)
            if len(page) < PAGE:
                break
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_node[r["node"]].append(r)
    out = []
    for name in sorted(by_node):
        gpus = by_node[name]
        models = Counter(g["model"] for g in gpus if g.get("model"))
        model = models.most_common(1)[0][0] if models else None
        out.append(
            check_versions(name, model, [(g["index"], g.get("info") or {}) for g in gpus], baseline)
        )
    return out


def local_status(
    sim: str | None, imports: list[Path], seed: int, baseline: BaselineFile
) -> list[NodeBaseline]:
    """Every node of a simulated fleet, imported reports, or this host."""
    from gpufleet.devices.discovery import collect, open_fleet

    fleet = open_fleet(sim=sim, imports=imports, seed=seed).bounded()
    try:
        nodes, _notes = collect(fleet)
    finally:
        fleet.close()
    return check_fleet(nodes, baseline)


def baseline_document(status: list[NodeBaseline], source: str) -> dict[str, Any]:
    """The JSON shape of ``inventory --baseline --json``."""
    out = [s for s in status if not s.compliant]
    return {
        "source": source,
        "nodes_total": len(status),
        "at_baseline": sum(1 for s in status if s.compliant),
        "out_of_baseline": [
            {
                "node": s.node,
                "model": s.model,
                "no_target": s.no_target,
                "verified": s.verified,
                "deviations": [
                    {
                        "gpu": d.gpu,
                        "field": d.field,
                        "found": d.found,
                        "target": d.target,
                        "status": d.status,
                    }
                    for d in s.deviations
                ],
            }
            for s in out
        ],
    }


def run(
    baseline_path: Path,
    *,
    sim: str | None,
    imports: list[Path],
    seed: int,
    controller: str | None,
    token: str | None,
    as_json: bool,
) -> int:
    """Print the report; the exit code is 1 when some node is out of baseline (scripts)."""
    from gpufleet.errors import UsageError

    baseline = load_baseline(baseline_path)
    if controller is not None:
        if sim or imports:
            raise UsageError("--controller reads the controller's fleet: not with --sim/--import")
        status = controller_status(controller, token, baseline)
        source = controller
    else:
        status = local_status(sim, imports, seed, baseline)
        source = sim or ("import" if imports else "this host")
    doc = baseline_document(status, source)
    if as_json:
        emit_json(doc)
    else:
        _print(doc)
    return 1 if doc["out_of_baseline"] else 0


def _print(doc: dict[str, Any]) -> None:
    out = doc["out_of_baseline"]
    console.print(
        f"{len(out)} of {doc['nodes_total']} node(s) out of baseline ({doc['source']})",
        highlight=False,
    )
    if not out:
        return
    table = Table()
    for col in ("node", "model", "gpu", "field", "found", "target"):
        table.add_column(col, overflow="fold")
    for n in out:
        if n["no_target"]:
            table.add_row(n["node"], n["model"] or "N/A", "", "", "", "no baseline for this model")
        for d in n["deviations"]:
            table.add_row(
                n["node"],
                n["model"] or "N/A",
                "" if d["gpu"] is None else str(d["gpu"]),
                d["field"],
                d["found"] or "unknown",
                d["target"],
            )
    console.print(fit(table))

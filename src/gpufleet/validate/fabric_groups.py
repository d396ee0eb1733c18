"""Pairwise results grouped by leaf switch and by rail: a bad leaf or rail is one finding.

Where the nodes hang in the fabric comes from a topology file, never from a guess:

- a cable map CSV as ``gpufleet plan --cables`` writes it (`gpufleet.plan.cablemap`): the
  ``compute`` network's ``node-leaf`` rows give, for each node's NIC ``nicR`` (rail R-1, which
  local rank R-1 drives in the pairwise test, `gpufleet.validate.pairwise`), its leaf switch;
- a Slurm ``topology.conf`` (``SwitchName=L Nodes=HOSTLIST``, topology/tree plugin): each
  node's leaf, without rails.

A *port* is one node's rail (or the whole node where rails are unknown); its figure is its
best transfer in the pairwise rounds (GB/s): a port that is slow is slow with every peer, a
healthy one is fast at least with the healthy peers, so a slow peer never drags it down (its
median would be, with half its peers behind one bad leaf). A leaf all of whose ports (two or more)
are slow is one finding ("leaf L2: 8 of 8 nodes slow"), and so is a rail slow on every node
(two or more); what is left is judged node by node and link by link as before. Without a
topology nothing is grouped and the report says so.
"""

from __future__ import annotations

import csv
import io
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.errors import ConfigError
from gpufleet.hostlist import expand
from gpufleet.validate.pairwise import PairSample
from gpufleet.validate.results import Metric, Status, TestResult

Port = tuple[str, int | None]  # (node, rail); rail None: the node as a whole
NO_TOPOLOGY_NOTE = (
    "pairwise: no topology given (--topology CABLE_MAP.csv or topology.conf), so slow nodes "
    "are not grouped by leaf switch or rail"
)


@dataclass(frozen=True)
class Topology:
    """Leaf switch of each port, from ``source``."""

    leaf_of: dict[Port, str]
    source: str
    rails: bool = False  # whether ports are rails (a cable map) or whole nodes

    def leaves(self) -> dict[str, list[Port]]:
        out: dict[str, list[Port]] = defaultdict(list)
        for port, leaf in sorted(self.leaf_of.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            out[leaf].append(port)
        return dict(out)


def parse_topology_conf(text: str, source: str) -> Topology:
    """Slurm ``topology.conf``: the switches that list ``Nodes=`` are the leaves."""
    leaf_of: dict[Port, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict((k.lower(), v) for k, _, v in (w.partition("=") for w in line.split()) if v)
        if "switchname" not in fields:
            raise ConfigError(f"{source}:{n}: expected SwitchName=NAME Nodes=... or Switches=...")
        if "nodes" in fields:
            for node in expand(fields["nodes"]):
                leaf_of[(node, None)] = fields["switchname"]
    if not leaf_of:
        raise ConfigError(f"{source}: no switch lists Nodes= (no leaf switches)")
    return Topology(leaf_of, source)


def parse_cable_map(text: str, source: str) -> Topology:
    """A plan cable map CSV: compute ``node-leaf`` rows, ``a_port`` ``nicR`` -> rail R-1."""
    reader = csv.DictReader(io.StringIO(text))
    need = {"network", "tier", "a_device", "a_port", "b_device"}
    missing = need - set(reader.fieldnames or ())
    if missing:
        raise ConfigError(f"{source}: not a cable map: no column(s) {', '.join(sorted(missing))}")
    leaf_of: dict[Port, str] = {}
    for row in reader:
        if row["network"] != "compute" or row["tier"] != "node-leaf":
            continue
        m = re.fullmatch(r"nic(\d+)", row["a_port"] or "")
        if m and int(m[1]) >= 1:
            leaf_of[(row["a_device"], int(m[1]) - 1)] = row["b_device"]
    if not leaf_of:
        raise ConfigError(f"{source}: no compute node-leaf cables with nicN ports")
    return Topology(leaf_of, source, rails=True)


def load_topology(path: Path) -> Topology:
    """A cable map CSV or a Slurm topology.conf (told apart by the CSV header)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the topology file ({exc})") from exc
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    if "a_device" in first and "," in first:
        return parse_cable_map(text, str(path))
    return parse_topology_conf(text, str(path))


def port_gbps(samples: Iterable[PairSample]) -> dict[Port, float]:
    """Best GB/s of each (node, rail) over its transfers, sent and received."""
    seen: dict[Port, list[float]] = defaultdict(list)
    for s in samples:
        if s.seconds <= 0:
            continue
        gbps = s.nbytes / s.seconds / 1e9
        seen[(s.sender, s.local_rank)].append(gbps)
        seen[(s.receiver, s.local_rank)].append(gbps)
    return {p: max(v) for p, v in seen.items()}


def node_port_gbps(matrix: dict[str, dict[str, float]]) -> dict[Port, float]:
    """Best link GB/s of each node (rails unknown)."""
    return {
        (n, None): max(v for p, v in row.items() if p != n)
        for n, row in matrix.items()
        if any(p != n for p in row)
    }


@dataclass
class Grouped:
    """Group findings, and the nodes each one explains."""

    results: list[TestResult] = field(default_factory=list)
    explained: dict[str, str] = field(default_factory=dict)  # node -> "leaf L2" / "rail 3"


def _finding(
    kind: str,
    name: str,
    ports: list[Port],
    ports_gbps: dict[Port, float],
    line: float,
    expected: float,
    source: str,
) -> TestResult:
    nodes = sorted({n for n, _ in ports})
    med = statistics.median(ports_gbps[p] for p in ports)
    what = "nodes" if kind == "leaf" else "nodes on this rail"
    msg = (
        f"{kind} {name}: {len(nodes)} of {len(nodes)} {what} slow (median {med:.1f} GB/s, "
        f"pass line {line:.1f}): the {'switch or its uplinks' if kind == 'leaf' else 'rail'}, "
        "not the nodes"
    )
    m = Metric("median_port", med, "GB/s", expected, line, Status.FAIL)  # of the best transfers
    return TestResult(
        "pairwise",
        "fleet",
        Status.FAIL,
        msg,
        metrics=[m],
        details={"group": kind, "name": name, "nodes": nodes, "topology": source},
    )


def group(
    ports_gbps: dict[Port, float],
    topology: Topology | None,
    expected_port_gbps: float | None,
    pass_fraction: float,
) -> tuple[Grouped, list[str]]:
    """Leaf and rail findings from per-port figures (``expected_port_gbps``: one port's
    expected figure, a rail's where ports are rails; None: the median port, for devices the
    catalog does not know); notes for the report."""
    out = Grouped()
    if topology is None:
        return out, [NO_TOPOLOGY_NOTE]
    if not ports_gbps:
        return out, []
    if expected_port_gbps is None:
        expected_port_gbps = statistics.median(ports_gbps.values())
    line = expected_port_gbps * pass_fraction
    slow = {p for p, v in ports_gbps.items() if v < line}
    taken: set[Port] = set()
    notes = [
        f"pairwise: grouped by leaf switch{' and rail' if topology.rails else ''} "
        f"from {topology.source}"
    ]
    if topology.rails:
        rails: dict[int, list[Port]] = defaultdict(list)
        for p in ports_gbps:
            if p[1] is not None:
                rails[p[1]].append(p)
        for r, ports in sorted(rails.items()):
            nodes = {n for n, _ in ports}
            if len(nodes) >= 2 and all(p in slow for p in ports):
                out.results.append(
                    _finding(
                        "rail", str(r), ports, ports_gbps, line, expected_port_gbps, topology.source
                    )
                )
                taken.update(ports)
                for n in nodes:
                    out.explained.setdefault(n, f"rail {r}")
    for leaf, ports in topology.leaves().items():
        mine = [p for p in ports if p in ports_gbps and p not in taken]
        nodes = {n for n, _ in mine}
        if len(nodes) >= 2 and all(p in slow for p in mine):
            out.results.append(
                _finding("leaf", leaf, mine, ports_gbps, line, expected_port_gbps, topology.source)
            )
            taken.update(mine)
            for n in nodes:
                out.explained.setdefault(n, f"leaf {leaf}")
    unmapped = sorted({n for n, _ in ports_gbps} - {n for n, _ in topology.leaf_of})
    if unmapped:
        notes.append(
            f"pairwise: {len(unmapped)} node(s) not in {topology.source}: "
            f"{', '.join(unmapped[:8])}{' ...' if len(unmapped) > 8 else ''}"
        )
    return out, notes


def apply(results: list[TestResult], grouped: Grouped) -> list[TestResult]:
    """The per-node and per-link pairwise results with the group that explains them noted
    (``details["explained_by"]``), then the group findings."""
    for r in results:
        sides = {side.split("/")[0] for side in r.component.split("<->")}
        why = sorted({grouped.explained[n] for n in sides if n in grouped.explained})
        if why and r.status is not Status.PASS:
            r.details["explained_by"] = why
            r.message += f" (see {', '.join(why)})"
    return [*results, *grouped.results]

"""Failover wall time on the path a user gets: fault -> job running on another node (issue 12).

Every run starts a real controller (embedded scheduler, default settings: service tick 1 s,
scheduler tick 0.5 s, lost after 3 heartbeats) and the agents of three simulated nodes as
`gpufleet up` runs them (`gpufleet.testing.testbed.UpAgents`: one exchange a second, 2 s
heartbeat, default 30 s job lease), with the job as a real process: a shell whose grandchild
appends ``(generation, time)`` heartbeats to a file. Wall time from the fault to the API showing
the job ``running`` on another node; p50 and p99 over ``--faults`` faults per scenario:

(a) reachable agent: XID 79 on the job's GPU. The node is drained for the fail finding, its
    agent kills the copy on its next exchange and reports it dead on the one after; the job
    starts elsewhere on that positive confirmation.
(b) agent killed: ``kill -9`` of the job's node agent, a separate process (the real
    ``gpufleet agent --run-jobs --executor process`` when this tree has ``--executor``, else a
    process running the same agent as `gpufleet up`). Nothing confirms the kill: the controller
    declares the node lost (3 x 2 s heartbeats) and starts the job once the fencing deadline
    passed (last contact + the agent's lease + 10 s report staleness, about 40 s). It also
    reports ``overlap_s``: how long the old copy's heartbeats went on after the new copy's
    first one. Without the per-job fencing supervisor (issue 12, item 1) the orphaned copy
    keeps running (overlap > 0); with it, the overlap must be 0.
(c) controller restarting during the fault: XID 79, then the controller stops at once and
    starts again on the same database after ``--outage`` seconds.

Compared with the 10 s target (issue 12) and the defaults of:
- Slurm: a node that stops answering is marked DOWN after ``SlurmdTimeout``, default 300 s
  (slurm.conf(5), https://slurm.schedmd.com/slurm.conf.html#OPT_SlurmdTimeout); the requeued
  job then waits further (``benchmarks/failover_slurm.py`` measures a real local Slurm).
- Kubernetes: the node controller marks a silent node NotReady/Unreachable after
  ``--node-monitor-grace-period`` 40 s (https://kubernetes.io/docs/reference/command-line-tools-reference/kube-controller-manager/),
  and pods tolerate ``node.kubernetes.io/not-ready`` and ``unreachable`` for 300 s, added by
  the DefaultTolerationSeconds admission plugin
  (https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#defaulttolerationseconds,
  https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/#taint-based-evictions):
  about 340 s before eviction, ~5 m 45 s until the replacement pod runs.

    python benchmarks/failover.py [--faults 20] [--scenarios a,b,c] [--outage 5] [--json]

Needs nothing but this tree (no GPU, no root). Wall times include the machine's load: run it
on an idle machine for figures to quote.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.devices.sim import SimFleet
from gpufleet.devices.sim.spec import FleetSpec, NodeSpec
from gpufleet.testing.testbed import Controller, UpAgents, wait_for

TARGET_S = 10.0  # issue 12: p99 fault -> running elsewhere
SLURM_DEFAULT_S = 300.0  # SlurmdTimeout default (slurm.conf(5)), before any requeue delay
K8S_DEFAULT_S = 345.0  # 40 s node-monitor-grace-period + 300 s toleration + pod start
HEARTBEATS = (
    '( while :; do echo "$GPUFLEET_GENERATION $(date +%s.%N)" >> "$HB"; sleep 0.05; done ) & wait'
)
MODEL = "h100-sxm"
SETUP_S = 120.0  # starting a run on a loaded machine; not part of any figure


def heartbeats(path: Path) -> dict[int, list[float]]:
    """Heartbeat times per generation."""
    out: dict[int, list[float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                out.setdefault(int(parts[0]), []).append(float(parts[1]))
    return out


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


class Run:
    """One controller and `gpufleet up`'s agents for the nodes ``names``, in ``root``."""

    def __init__(self, root: Path, names: list[str]) -> None:
        self.root = root
        self.ctl = Controller(root / "data", tick_s=1.0).start()
        fleet = SimFleet(FleetSpec(tuple(NodeSpec(n, MODEL, 2) for n in names)))
        self.node_tokens = self.ctl.node_tokens(fleet)  # node-bound, as `gpufleet up` makes
        self.agents = UpAgents(self.ctl.url, "", fleet, root, tokens=self.node_tokens).start()
        self.hb = root / "hb"

    def job(self, jid: str) -> dict[str, Any]:
        return dict(self.ctl.call("GET", f"/api/v1/jobs/{jid}").json())

    def submit(self) -> str:
        body = {"name": "hb", "command": ["sh", "-c", HEARTBEATS], "env": {"HB": str(self.hb)}}
        return str(self.ctl.call("POST", "/api/v1/jobs", json=body).json()["id"])

    def running(self, jid: str, not_on: str | None = None, limit_s: float = 30) -> dict[str, Any]:
        def moved() -> dict[str, Any] | None:
            j = self.job(jid)
            ok = j["state"] == "running" and j["nodes"] and j["nodes"][0] != not_on
            return j if ok else None

        got: dict[str, Any] = wait_for(moved, limit_s, f"job {jid} running", 0.02)
        return got

    def nodes_known(self, n: int) -> None:
        def known() -> bool:
            r = self.ctl.call("GET", "/api/v1/nodes").json()
            return sum(1 for x in r["nodes"] if x["state"] == "in_service") >= n

        _setup(lambda: wait_for(known, SETUP_S, "nodes in service"))

    def overlap_s(self) -> float:
        """How long the old generation's heartbeats went on after the new one's first."""
        beats = heartbeats(self.hb)
        gens = sorted(beats)
        if len(gens) < 2:
            return 0.0
        return max(0.0, max(beats[gens[0]]) - min(beats[gens[-1]]))

    def stop(self) -> None:
        self.agents.stop()
        self.ctl.stop()


class SetupFailed(Exception):
    """A run could not be set up (before any fault): it measures nothing."""


def _setup(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except TimeoutError as exc:
        raise SetupFailed(str(exc)) from exc


def xid_fault(root: Path, outage_s: float | None) -> dict[str, float]:
    """(a) and (c): XID 79 on the job's GPU (with a controller outage right after, for (c))."""
    run = Run(root, ["n1", "n2", "n3"])
    try:
        run.nodes_known(3)
        jid = run.submit()
        first = _setup(lambda: run.running(jid, limit_s=SETUP_S))
        _setup(lambda: wait_for(lambda: heartbeats(run.hb).get(1), SETUP_S, "heartbeats"))
        node, gpu = first["nodes"][0], first["gpu_indexes"][0]
        t0 = time.time()
        run.agents.inject_xid79(node, gpu)
        if outage_s is not None:
            run.ctl.stop()
            time.sleep(outage_s)
            run.ctl.start()
        run.running(jid, not_on=node, limit_s=120)
        took = time.time() - t0
        wait_for(lambda: heartbeats(run.hb).get(2), 30, "second copy's heartbeats")
        return {"seconds": took, "overlap_s": run.overlap_s()}
    finally:
        run.stop()


def _agent_process(run: Run, node: str, state: Path) -> subprocess.Popen[bytes]:
    """The job's node agent as its own process (what ``kill -9`` hits)."""
    token = run.node_tokens.get(node) or run.ctl.token("agent", node=node)
    env = {**os.environ, "GPUFLEET_AGENT_TOKEN": token}
    state.mkdir(parents=True, exist_ok=True)
    fleet_file = state / "fleet.yaml"  # one simulated node with the job's node name
    fleet_file.write_text(f"nodes:\n  - {{name: {node}, model: {MODEL}, gpus: 2}}\n")
    # the real agent with jobs as processes under their fencing wrapper (issue 12, item 1)
    argv = [
        *(sys.executable, "-m", "gpufleet", "agent", "--sim", str(fleet_file)),
        *("--run-jobs", "--executor", "process", "--controller", run.ctl.url),
        *("--state-dir", str(state), "--listen", "127.0.0.1:0", "--push-interval", "1"),
    ]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def agent_killed(root: Path) -> dict[str, float]:
    """(b): the job's node agent is killed with SIGKILL."""
    run = Run(root, ["n2", "n3"])
    proc = _agent_process(run, "n1", root / "n1")
    try:
        run.nodes_known(3)
        nodes = [n["name"] for n in run.ctl.call("GET", "/api/v1/nodes").json()["nodes"]]
        lone = next(n for n in nodes if n not in ("n2", "n3"))
        for n in ("n2", "n3"):  # the job must start on the separate agent's node
            run.ctl.call("POST", f"/api/v1/nodes/{n}/actions/cordon", json={"reason": "bench"})
        jid = run.submit()
        _setup(lambda: run.running(jid, limit_s=SETUP_S))
        _setup(lambda: wait_for(lambda: heartbeats(run.hb).get(1), SETUP_S, "heartbeats"))
        for n in ("n2", "n3"):
            run.ctl.call("POST", f"/api/v1/nodes/{n}/actions/uncordon", json={"reason": "bench"})
        t0 = time.time()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        run.running(jid, not_on=lone, limit_s=180)
        took = time.time() - t0
        wait_for(lambda: heartbeats(run.hb).get(2), 30, "second copy's heartbeats")
        time.sleep(1.0)  # an orphaned first copy would still be writing
        return {"seconds": took, "overlap_s": run.overlap_s()}
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_orphans(root / "n1")
        run.stop()


def _kill_orphans(state: Path) -> None:
    """Kill job process groups a killed agent left behind (their ``pid`` files)."""
    for pid_file in state.rglob("pid"):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            continue


SCENARIOS: dict[str, tuple[str, Callable[[Path, argparse.Namespace], dict[str, float]]]] = {
    "a": ("reachable agent (XID 79)", lambda root, args: xid_fault(root, None)),
    "b": ("agent killed (kill -9)", lambda root, args: agent_killed(root)),
    "c": (
        "controller restarting during the fault",
        lambda root, args: xid_fault(root, args.outage),
    ),
}


def measure(key: str, args: argparse.Namespace) -> dict[str, Any]:
    title, fn = SCENARIOS[key]
    times: list[float] = []
    overlaps: list[float] = []
    setup_failures = 0
    while len(times) < args.faults and setup_failures < args.faults:
        root = Path(tempfile.mkdtemp(prefix=f"gpufleet-failover-{key}{len(times)}-"))
        try:
            r = fn(root, args)
        except SetupFailed as exc:  # before the fault: this run measures nothing, run again
            setup_failures += 1
            print(f"  ({key}) setup failed, run again: {exc}", file=sys.stderr, flush=True)
            continue
        finally:
            shutil.rmtree(root, ignore_errors=True)
        i = len(times)
        times.append(r["seconds"])
        overlaps.append(r["overlap_s"])
        if not args.json:
            print(f"  ({key}) fault {i + 1}: {r['seconds']:.2f} s", flush=True)
    p99 = pct(times, 99)
    return {
        "scenario": f"{key}: {title}",
        "faults": len(times),
        "setup_failures": setup_failures,
        "seconds": [round(t, 3) for t in times],
        "p50_s": round(statistics.median(times), 3),
        "p99_s": round(p99, 3),
        "max_overlap_s": round(max(overlaps), 3),
        "target_s": TARGET_S,
        "meets_target": p99 < TARGET_S,
        "vs_slurm_default": round(SLURM_DEFAULT_S / p99, 1),
        "vs_kubernetes_default": round(K8S_DEFAULT_S / p99, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--faults", type=int, default=20, help="faults per scenario")
    ap.add_argument("--scenarios", default="a,b,c", help="comma-separated: a, b, c")
    ap.add_argument("--outage", type=float, default=5.0, help="(c): controller down, seconds")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    keys = [k.strip() for k in args.scenarios.split(",") if k.strip()]
    unknown = [k for k in keys if k not in SCENARIOS]
    if unknown or args.faults < 1:
        ap.error(f"--scenarios: unknown {unknown}; --faults must be >= 1")
    results = [measure(k, args) for k in keys]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(
            f"fault -> job running elsewhere (target p99 < {TARGET_S:g} s; defaults: Slurm "
            f"SlurmdTimeout {SLURM_DEFAULT_S:g} s, Kubernetes ~{K8S_DEFAULT_S:g} s)"
        )
        for r in results:
            print(
                f"({r['scenario']}) p50 {r['p50_s']:.2f} s, p99 {r['p99_s']:.2f} s over "
                f"{r['faults']} faults: {'meets' if r['meets_target'] else 'MISSES'} the target; "
                f"{r['vs_slurm_default']}x faster than Slurm's default, "
                f"{r['vs_kubernetes_default']}x than Kubernetes'; "
                f"old copy alive after the new one started: {r['max_overlap_s']:.2f} s max"
            )
    return 0 if all(r["meets_target"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

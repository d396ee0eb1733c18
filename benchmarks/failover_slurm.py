"""Failover time: from a fatal GPU fault (XID 79, through the simulator) to the job running on
another node (issue 7's figures).

(a) gpufleet driving the REAL local Slurm cluster: simulated agents for gpu1..gpu3 push to a
    real controller (``--scheduler slurm``); the fault makes the agent report XID 79, the
    controller's lifecycle drains the node and requeues the node's jobs through SlurmBackend
    (``scontrol update state=drain``, ``scontrol requeue`` + the StartTime=now fix). Also
    (a0): the drain + requeue calls alone, without detection.
(c) The same through the controller on the embedded backend (agents run simulated jobs).
(b) Slurm alone with its defaults: a node's slurmd stops answering; Slurm marks it DOWN after
    SlurmdTimeout (300 s default, slurm.conf(5)), requeues the job, and the requeued job waits
    cred_expire + 1 s (120 s default, slurm.conf(5) AuthInfo) before it may start. By default
    this reports the configured waits; ``--slow`` measures it (with ``--slurmd-timeout``).

    python benchmarks/failover.py [--json] [--slow] [--slurmd-timeout 300] [--runs 3]
(a), (a0) and (b) need root and Debian's slurmctld slurmd slurm-client munge; (c) needs nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from gpufleet.schedulers.base import JobSpec, JobState
from gpufleet.schedulers.slurm.backend import SlurmBackend
from gpufleet.schedulers.slurm.devcluster import DevCluster, temp_cluster

TARGET_S = 10.0  # issue 7: under 10 s from fault to job running elsewhere


def _running(
    b: SlurmBackend, job: str, limit_s: float, not_on: str | None = None
) -> tuple[str, float]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        j = b.job(job)
        if j.state is JobState.RUNNING and j.nodes and j.nodes[0] != not_on:
            return j.nodes[0], time.monotonic() - t0
        time.sleep(0.05)
    raise SystemExit(f"job {job} did not run within {limit_s:g} s")


def _config(dev: DevCluster) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "show", "config"],
        env=dev.env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    return dict(re.findall(r"^(\w+)\s*=\s*(.*?)\s*$", out, flags=re.M))


def gpufleet_case(runs: int) -> dict[str, object]:
    dev = temp_cluster()
    try:
        dev.up()
        b = SlurmBackend(slurm_conf=str(dev.slurm_conf), output_dir=str(dev.root / "jobs"))
        times = []
        for i in range(runs):
            job = b.submit(JobSpec(name=f"failover-{i}", gpus=1, duration_s=600))
            node, _ = _running(b, job, 30)
            t0 = time.monotonic()
            b.drain(node, "benchmark: XID 79 (GPU fell off the bus)")
            b.requeue(job)
            _, _ = _running(b, job, 60, not_on=node)
            times.append(time.monotonic() - t0)
            b.cancel(job)
            b.resume(node)
        return _summary("a0: drain+requeue calls alone (no detection)", times)
    finally:
        dev.down()
        shutil.rmtree(dev.root, ignore_errors=True)


def _summary(case: str, times: list[float]) -> dict[str, object]:
    return {
        "case": case,
        "runs": len(times),
        "seconds": times,
        "max_s": max(times),
        "target_s": TARGET_S,
        "ok": max(times) < TARGET_S,
    }


def controller_slurm_case(runs: int) -> dict[str, object]:
    """(a): XID 79 on the job's node -> agent -> controller lifecycle -> Slurm drain + requeue."""
    import tempfile
    from pathlib import Path

    from gpufleet.devices.sim import SimFleet
    from gpufleet.devices.sim.spec import FleetSpec, NodeSpec
    from gpufleet.testing.testbed import Agents, Controller, wait_for

    dev = temp_cluster()
    work = Path(tempfile.mkdtemp(prefix="gpufleet-failover-"))
    try:
        dev.up()
        b = SlurmBackend(slurm_conf=str(dev.slurm_conf), output_dir=str(dev.root / "jobs"))
        times = []
        for i in range(runs):
            ctl = Controller(work / f"run{i}", scheduler=b).start()
            names = dev.node_names()
            fleet = SimFleet(FleetSpec(tuple(NodeSpec(n, "h100-sxm", 2) for n in names)))
            agents = Agents(ctl.url, ctl.token("agent"), fleet, run_jobs=False).start()
            try:
                svc = ctl.service
                assert svc is not None
                wait_for(
                    lambda svc=svc: all(  # type: ignore[misc]
                        (nc := svc.store.nodes.get(n)) is not None and nc.state == "in_service"
                        for n in names  # noqa: B023 (used before the loop moves on)
                    ),
                    15,
                    "nodes in service",
                )
                r = ctl.call(
                    "POST", "/api/v1/jobs", json={"name": f"rq{i}", "command": ["sleep", "600"]}
                )
                job = r.json()["id"]
                node, _ = _running(b, job, 30)
                t0 = time.monotonic()
                agents.inject_xid79(node, 0)
                _running(b, job, 60, not_on=node)
                times.append(time.monotonic() - t0)
                b.cancel(job)
            finally:
                agents.stop()
                ctl.stop()
                for n in dev.node_names():
                    with contextlib.suppress(Exception):  # not drained: nothing to resume
                        b.resume(n)
        return _summary("a: agent + controller driving Slurm (XID 79)", times)
    finally:
        dev.down()
        shutil.rmtree(dev.root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def controller_embedded_case(runs: int) -> dict[str, object]:
    """(c): XID 79 on the job's GPU -> agent -> controller (embedded) -> another node's agent."""
    import tempfile
    from pathlib import Path

    from gpufleet.devices.sim import SimFleet
    from gpufleet.devices.sim.spec import FleetSpec, NodeSpec
    from gpufleet.schedulers.embedded.backend import EmbeddedBackend
    from gpufleet.testing.testbed import Agents, Controller, wait_for

    work = Path(tempfile.mkdtemp(prefix="gpufleet-failover-"))
    times = []
    try:
        for i in range(runs):
            ctl = Controller(work / f"run{i}", scheduler="embedded").start()
            fleet = SimFleet(FleetSpec(tuple(NodeSpec(f"n{k}", "h100-sxm", 2) for k in (1, 2, 3))))
            agents = Agents(ctl.url, ctl.token("agent"), fleet).start()
            try:
                jobs = ctl.service.scheduler if ctl.service else None
                assert isinstance(jobs, EmbeddedBackend)
                wait_for(lambda j=jobs: len(j.store.nodes()) == 3, 15, "agents")  # type: ignore[misc]
                body = {"name": "c", "command": ["sim"], "max_restarts": 3, "duration_s": 600}
                jid = ctl.call("POST", "/api/v1/jobs", json=body).json()["id"]

                def copy(jid: str = jid) -> tuple[str, int, str] | None:
                    return next((c for c in agents.running_copies() if c[0] == jid), None)  # noqa: B023

                first = wait_for(copy, 15, "job running")
                gpu = agents.executor.copies[first].launch.gpus[0]
                t0 = time.monotonic()
                agents.inject_xid79(first[2], gpu)
                wait_for(lambda: (c := copy()) is not None and c[2] != first[2], 60, "moved", 0.01)  # noqa: B023
                times.append(time.monotonic() - t0)
            finally:
                agents.stop()
                ctl.stop()
        return _summary("c: agent + controller, embedded backend (XID 79)", times)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def slurm_alone_case(slow: bool, slurmd_timeout: int) -> dict[str, object]:
    extra = {"SlurmdTimeout": str(slurmd_timeout)} if slow else {}
    dev = temp_cluster(extra_conf=extra)
    try:
        dev.up()
        cfg = _config(dev)
        timeout_s = int(cfg.get("SlurmdTimeout", "300 sec").split()[0])
        cred = re.search(r"cred_expire=(\d+)", cfg.get("AuthInfo", ""))
        cred_s = int(cred.group(1)) if cred else 120
        out: dict[str, object] = {
            "case": "b: Slurm alone",
            "SlurmdTimeout_s": timeout_s,
            "cred_expire_s": cred_s,
            "configured_wait_s": timeout_s + cred_s + 1,
            "note": "node DOWN after SlurmdTimeout, then the requeued job waits cred_expire+1 s",
        }
        if not slow:
            return out
        b = SlurmBackend(slurm_conf=str(dev.slurm_conf), output_dir=str(dev.root / "jobs"))
        job = b.submit(JobSpec(name="failover-slurm", gpus=1, duration_s=3600))
        node, _ = _running(b, job, 30)
        pid = dev.pids[f"slurmd-{node}"]
        t0 = time.monotonic()
        os.kill(pid, signal.SIGSTOP)  # the node stops answering, like a hung or dead host
        try:
            _, _ = _running(b, job, timeout_s + cred_s + 120, not_on=node)
        finally:
            os.kill(pid, signal.SIGCONT)
        out["measured_s"] = time.monotonic() - t0
        return out
    finally:
        dev.down()
        shutil.rmtree(dev.root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--slow", action="store_true", help="measure case (b) (minutes)")
    ap.add_argument("--slurmd-timeout", type=int, default=300, help="SlurmdTimeout for --slow")
    ap.add_argument("--embedded-only", action="store_true", help="only case (c): no Slurm")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = [controller_embedded_case(args.runs)]
    if not args.embedded_only:
        results += [
            controller_slurm_case(args.runs),
            gpufleet_case(args.runs),
            slurm_alone_case(args.slow, args.slurmd_timeout),
        ]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            if "seconds" in r:
                secs = ", ".join(f"{x:.2f}" for x in list(r["seconds"]))  # type: ignore[call-overload]
                print(
                    f"({r['case']}) fault -> running elsewhere: {secs} s (target < {TARGET_S:g} s)"
                )
            else:
                print(
                    f"(b: Slurm alone) SlurmdTimeout {r['SlurmdTimeout_s']} s + requeue delay "
                    f"{r['cred_expire_s']}+1 s = {r['configured_wait_s']} s configured"
                    + (f"; measured {r['measured_s']:.1f} s" if "measured_s" in r else "")
                )
    return 0 if all(r.get("ok", True) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

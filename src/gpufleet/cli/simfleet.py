"""`gpufleet sim-fleet`: many simulated nodes in one process, each a real agent
(`gpufleet.agent.fleet.FleetDriver`), pushing to a control plane over HTTP.

With an admin token and ``--run-jobs`` it makes one agent token bound to each node (and revokes
them when it stops): the control plane takes job slots only from node-bound agent tokens. With
an agent token the nodes push telemetry under it, and offer no job slots unless it is bound to
the only node."""

from __future__ import annotations

import dataclasses
import signal
import ssl
import tempfile
import threading
from pathlib import Path
from typing import Any

from gpufleet.cli.output import console, emit_json, err_console


def run_sim_fleet(
    controller_url: str,
    token: str,
    short_spec: str,
    *,
    faults: Path | None,
    duration: float | None,
    sample_interval: float,
    push_interval: float,
    concurrency: int,
    prefix: str,
    state_dir: Path | None,
    run_jobs: bool,
    seed: int,
    json_out: bool,
    verify: ssl.SSLContext | bool = True,
) -> None:
    from gpufleet.agent.fleet import FleetConfig, FleetDriver, job_runners
    from gpufleet.devices.sim import SimFleet
    from gpufleet.devices.sim.spec import parse_short_spec

    spec = parse_short_spec(short_spec, seed=seed, prefix=prefix)
    if faults is not None:
        spec = dataclasses.replace(spec, faults=load_faults(faults, {n.name for n in spec.nodes}))
    fleet = SimFleet(spec)
    fleet.demo_activity()
    backends = fleet.backends()
    names = [b.node_name for b in backends]
    tokens, minted = node_tokens(controller_url, token, names) if run_jobs else ({}, [])
    tmp = tempfile.TemporaryDirectory(prefix="gpufleet-sim-fleet-") if state_dir is None else None
    root = Path(tmp.name) if tmp is not None else state_dir
    assert root is not None
    try:
        driver = FleetDriver(
            backends,
            FleetConfig(
                controller=controller_url,
                token=token,
                tokens=tokens,
                state_dir=root / "agents",
                fast_interval_s=sample_interval,
                push_interval_s=push_interval,
                connections=concurrency,
                verify=verify,
            ),
            jobs=job_runners(backends, fleet, root / "jobs") if run_jobs else {},
        )
        if not json_out:
            gpus = sum(b.device_count() for b in backends)
            err_console.print(
                f"{len(backends)} simulated node(s), {gpus} GPUs, sampled every "
                f"{sample_interval:g} s, pushing to {controller_url} every {push_interval:g} s "
                "(Ctrl-C stops)",
                highlight=False,
                soft_wrap=True,
            )
        stop = threading.Event()
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, lambda *_: stop.set())
        try:
            stats = driver.run(stop, duration)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        if tmp is not None:
            tmp.cleanup()
        revoke_tokens(controller_url, token, minted)
    out = dataclasses.asdict(stats)
    if json_out:
        emit_json(out)
    else:
        console.print(
            f"acked {stats.batches_acked} batches ({stats.gpu_samples} GPU samples taken); "
            f"errors {stats.errors}, throttled {stats.throttled}, spooled {stats.spooled}; "
            f"push p99 {stats.push_p99_ms or 0:.1f} ms"
        )


def load_faults(path: Path, names: set[str]) -> tuple[Any, ...]:
    """The faults of a YAML file (a list, or a mapping with ``faults``), checked against the
    fleet's node names; errors name the file, line and field."""
    from gpufleet.devices.sim.spec import parse_faults_yaml
    from gpufleet.yamldoc import read_text_file

    return parse_faults_yaml(read_text_file(path, "faults file"), str(path), names)


def node_tokens(url: str, token: str, names: list[str]) -> tuple[dict[str, str], list[int]]:
    """Agent tokens bound to each node, made with an admin ``token`` (their ids, to revoke at
    the end); none (with a warning) for another kind of token."""
    from gpufleet.client import Client, ControllerUnreachable

    with Client(url, token) as client:
        try:
            me = client.whoami()
        except ControllerUnreachable as exc:  # the agents spool until it answers
            err_console.print(f"warning: {exc}; the nodes offer no job slots this run")
            return {}, []
        if me.role != "admin":
            if me.node is None or len(names) > 1:
                err_console.print(
                    "warning: jobs are sent only to agents with a node-bound token; with this "
                    f"{me.role} token the nodes offer no job slots (give an admin token "
                    "and sim-fleet makes one per node)",
                    highlight=False,
                    soft_wrap=True,
                )
            return {}, []
        tokens: dict[str, str] = {}
        ids: list[int] = []
        for name in names:
            made = client.request(
                "POST",
                "/tokens",
                json={"role": "agent", "name": f"sim-fleet-{name}"[:128], "node": name},
            )
            tokens[name] = str(made["token"])
            ids.append(int(made["id"]))
        return tokens, ids


def revoke_tokens(url: str, token: str, ids: list[int]) -> None:
    """Revoke the node tokens this run made (best effort: the controller may be gone)."""
    from gpufleet.client import Client
    from gpufleet.errors import GpufleetError

    if not ids:
        return
    try:
        with Client(url, token, timeout_s=5.0) as client:
            for tid in ids:
                client.request("DELETE", f"/tokens/{tid}")
    except GpufleetError as exc:
        err_console.print(f"warning: could not revoke this run's node tokens: {exc}")

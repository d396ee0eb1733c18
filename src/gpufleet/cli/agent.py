"""`gpufleet agent`: run the node agent (sampler, health, /metrics, push to the control plane)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

import typer

from gpufleet.cli.common import JsonOption, SeedOption, SimOption, read_token
from gpufleet.cli.output import console, emit_json
from gpufleet.cli.process import CaOption, TlsCertOption, TlsKeyOption
from gpufleet.devices.host import read_host
from gpufleet.errors import UsageError

EXECUTORS = ("auto", "process", "sim")


def register(app: typer.Typer) -> None:
    """Attach `gpufleet agent`."""

    @app.command("agent")
    def agent_cmd(
        sim: str | None = SimOption,
        seed: int = SeedOption,
        listen: str = typer.Option(
            "127.0.0.1:9400", "--listen", help="HOST:PORT for /metrics, /health, /healthz."
        ),
        controller: str | None = typer.Option(
            None, "--controller", help="Control plane URL; batches go to URL/api/v1/ingest."
        ),
        token: str | None = typer.Option(
            None,
            "--token",
            envvar="GPUFLEET_AGENT_TOKEN",
            help="Agent bearer token (prefer --token-file: a --token shows in `ps`).",
        ),
        token_file: Path | None = typer.Option(
            None,
            "--token-file",
            envvar="GPUFLEET_AGENT_TOKEN_FILE",
            help="Read the agent token from this file (first line).",
            metavar="FILE",
        ),
        state_dir: Path = typer.Option(
            Path("/var/lib/gpufleet/agent"),
            "--state-dir",
            help="Sequence numbers, agent id and the offline spool live here.",
        ),
        fast_interval: float = typer.Option(1.0, "--fast-interval", help="Fast tier, seconds."),
        slow_interval: float = typer.Option(30.0, "--slow-interval", help="Slow tier, seconds."),
        push_interval: float = typer.Option(5.0, "--push-interval", help="Push period, seconds."),
        power_check_interval: float = typer.Option(
            60.0,
            "--power-check-interval",
            help="How often the limits of fleet power orders are checked and set again where a "
            "reboot or `nvidia-smi -pl` changed them, seconds.",
        ),
        duration: float = typer.Option(
            0.0,
            "--duration",
            min=0,
            help="Stop after this many seconds (0: run until stopped).",
        ),
        log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error."),
        run_jobs: bool = typer.Option(
            False,
            "--run-jobs",
            help="Run the jobs the control plane's embedded scheduler places on this node.",
        ),
        job_lease: float = typer.Option(
            30.0,
            "--job-lease",
            help="Seconds without a successful contact with the control plane after which the "
            "node's jobs are killed (their wrappers also kill them at once if the agent dies).",
        ),
        executor: str = typer.Option(
            "auto",
            "--executor",
            help="How jobs run: process (real processes under a fencing wrapper), sim (load on "
            "the simulated GPUs), auto (sim with --sim, else process).",
        ),
        tls_cert: Path | None = TlsCertOption,
        tls_key: Path | None = TlsKeyOption,
        ca: Path | None = CaOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Run the node agent until SIGTERM/SIGINT (or --duration)."""
        import httpx

        from gpufleet.agent.runner import Agent, AgentConfig
        from gpufleet.agent.server import AgentServer, parse_listen
        from gpufleet.cli.process import check_gpu_limit, private_state
        from gpufleet.devices.discovery import open_fleet
        from gpufleet.tls import TlsFiles, client_verify
        from gpufleet.wire.limits import MIN_HEARTBEAT_S

        if fast_interval <= 0 or slow_interval <= 0 or push_interval <= 0:
            raise UsageError("--fast-interval, --slow-interval and --push-interval must be > 0")
        if push_interval < MIN_HEARTBEAT_S:  # the push interval is the announced heartbeat
            raise UsageError(
                f"--push-interval {push_interval:g}: at least {MIN_HEARTBEAT_S:g} s (the "
                "controller refuses a shorter heartbeat interval)"
            )
        if not 0 < power_check_interval <= 86400:
            raise UsageError("--power-check-interval must be > 0 and at most 86400 seconds")
        token = read_token(token, token_file)
        if executor not in EXECUTORS:
            raise UsageError(f"--executor must be one of {', '.join(EXECUTORS)}, not {executor!r}")
        if job_lease <= 0:
            raise UsageError("--job-lease must be > 0")
        if controller and not token:
            raise UsageError(
                "--controller needs --token-file (or GPUFLEET_AGENT_TOKEN_FILE, "
                "GPUFLEET_AGENT_TOKEN, --token)"
            )
        logging.basicConfig(
            level=getattr(logging, log_level.upper(), logging.INFO),
            format='{"t":"%(asctime)s","level":"%(levelname)s","msg":"%(message)s"}'
            if json_out
            else "%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        # one INFO line per push from the HTTP client would drown the agent's own log
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.root.level))
        tls = TlsFiles.from_options(tls_cert, tls_key)
        verify = client_verify(ca)
        private_state(state_dir)
        host, port = parse_listen(listen)
        fleet = open_fleet(sim=sim, seed=seed)
        if not fleet.backends:
            raise UsageError("the agent needs live GPUs or --sim, not imported reports")
        if len(fleet.backends) > 1:
            console.print(f"[yellow]--sim has {len(fleet.backends)} nodes; serving the first[/]")
        backend = fleet.backends[0]
        if controller:
            check_gpu_limit([backend], "--sim" if sim else "the node")
        cfg = AgentConfig(
            fast_interval_s=fast_interval,
            slow_interval_s=slow_interval,
            push_interval_s=push_interval,
            power_check_interval_s=power_check_interval,
            controller=controller,
            token=token,
            state_dir=state_dir,
            host_findings=() if sim else _readiness(backend),
            host=None if sim else read_host(),
            validate_argv=_validate_argv(sim, seed, backend.node_name),
            # a simulated node from a fleet file keeps its locks too (`devices.sim.locks`)
            clock_state_file=_clock_state_file(),
        )
        client = httpx.Client(timeout=5.0, verify=verify) if controller else None
        agent = Agent(backend, cfg, client=client)
        if run_jobs:
            if not controller:
                raise UsageError("--run-jobs needs --controller (jobs come from the control plane)")
            agent.enable_jobs(_agent_jobs(fleet, backend, state_dir, job_lease, executor))
        server = AgentServer(agent, host, port, tls=tls.server_context() if tls else None).start()
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        started = {
            "node": backend.node_name,
            "gpus": backend.device_count(),
            "listen": f"{host}:{server.port}",
            "controller": controller,
            "agent_id": agent.state.agent_id if agent.state else None,
        }
        if json_out:
            emit_json({"event": "started", **started}, line=True)  # JSON Lines: one per event
        else:
            console.print(
                f"gpufleet agent on {started['node']}: {started['gpus']} GPUs, "
                f"{server.scheme}://{started['listen']}/metrics"
                + (f", pushing to {controller}" if controller else ""),
                highlight=False,
                soft_wrap=True,  # one line in a journal, URLs unbroken
            )
        try:
            agent.run(stop, duration_s=duration or None)
        finally:
            server.stop()
            agent.close()  # shuts NVML down unless a call hangs (then exits leaving it up)
            if client is not None:
                client.close()
        if json_out:
            emit_json({"event": "stopped", "rounds": agent.sampler.ticks}, line=True)
        if agent.restart_wanted:  # a maintenance update ended: start afresh (NVML, versions)
            import os
            import sys

            os.execv(sys.executable, [sys.executable, "-m", "gpufleet", *sys.argv[1:]])


def _clock_state_file() -> Path:
    """Where `power sweep --clocks` records locks (reset at start if a sweep crashed)."""
    from gpufleet.energy.clocks import default_clock_state_file

    return default_clock_state_file()


def _validate_argv(sim: str | None, seed: int, node: str) -> tuple[str, ...]:
    """How this agent runs `gpufleet validate` at the levels a campaign may ask (2, 3): over
    the same simulated node, or this host's GPUs."""
    import sys

    argv = (sys.executable, "-m", "gpufleet", "validate")
    if sim:
        return (*argv, "--sim", sim, "--seed", str(seed), "--nodes", node)
    return argv


def _agent_jobs(
    fleet: object, backend: object, state_dir: Path, lease_s: float, executor: str
) -> Any:
    """Jobs on this node: real processes (LocalProcessExecutor under fencing wrappers) or
    simulated GPU load (SimExecutor). The GPUs offered come from the agent's sampler at each
    report (`Agent.enable_jobs`), so a GPU lost later is no longer offered."""
    from gpufleet.agent.jobs import AgentJobs
    from gpufleet.schedulers.embedded import LocalProcessExecutor, SimExecutor

    sim = getattr(fleet, "sim", None)
    if executor == "sim" and sim is None:
        raise UsageError("--executor sim needs --sim (it loads the simulated GPUs)")
    if sim is not None and executor in ("sim", "auto"):
        return AgentJobs(
            backend.node_name,  # type: ignore[attr-defined]
            SimExecutor(sim, lease_s=lease_s),
            lease_s=lease_s,
        )
    local = LocalProcessExecutor(root=state_dir / "jobs", lease_s=lease_s, fenced=True)
    return AgentJobs(
        backend.node_name,  # type: ignore[attr-defined]
        local,
        lease_s=lease_s,
        on_contact=local.renew_lease,
    )


def _readiness(backend: Any) -> tuple[Any, ...]:
    """This host's readiness checks (`gpufleet doctor`'s) as findings, once at start; a real
    node only (a simulated one is not this host)."""
    from gpufleet.readiness.run import nvml_facts, readiness_findings

    found = readiness_findings(nvml=nvml_facts(backend))
    for f in found:
        logging.getLogger("gpufleet.agent").warning("readiness: %s: %s", f.code, f.message)
    return tuple(found)

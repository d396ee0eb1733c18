"""`gpufleet doctor`: can gpufleet talk to the GPUs here, is the node ready for day one, and what
to fix if not."""

from __future__ import annotations

import socket
import tempfile
from dataclasses import replace
from pathlib import Path

import typer
from rich.table import Table

from gpufleet.checklist.inputs import load_json, plan_port_gbps
from gpufleet.cli.common import JsonOption, SeedOption, SimOption
from gpufleet.cli.output import console, emit_json, fit, to_jsonable
from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.discovery import open_fleet
from gpufleet.devices.doctor import (
    Check,
    DoctorReport,
    check_backend,
    check_environment,
    overall_status,
)
from gpufleet.errors import GpufleetError, NoDeviceError, UsageError
from gpufleet.readiness import (
    Expectations,
    FileRunner,
    Host,
    NvmlFacts,
    SystemRunner,
    nvml_facts,
    run_readiness,
)
from gpufleet.readiness.simhost import SimHost, sim_host, write_tree

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "unknown": "magenta", "skip": "dim"}
EXIT = {"ok": 0, "warn": 1, "fail": 2, "unknown": 3}
LINK_LAYERS = {
    "ib": "InfiniBand",
    "infiniband": "InfiniBand",
    "eth": "Ethernet",
    "ethernet": "Ethernet",
}


def _expectations(
    cuda: list[str] | None,
    ib_rate: float | None,
    link_layer: str | None,
    mtu: int | None,
    nvswitch: bool | None,
    containers: bool | None,
    plan: Path | None,
) -> Expectations:
    versions = tuple(v.strip() for c in cuda or [] for v in c.split(",") if v.strip())
    layer = None
    if link_layer is not None:
        layer = LINK_LAYERS.get(link_layer.lower())
        if layer is None:
            raise UsageError(f"--link-layer {link_layer!r}: expected ib or eth")
    if ib_rate is None and plan is not None:
        ib_rate = plan_port_gbps(load_json(plan, "--plan"), f"--plan {plan}")
    if ib_rate is not None and ib_rate <= 0:
        raise UsageError(f"--ib-rate {ib_rate:g}: expected Gb/s > 0, e.g. 400")
    if mtu is not None and not 576 <= mtu <= 65535:
        raise UsageError(f"--mtu {mtu}: expected 576-65535")
    return Expectations(
        cuda=versions,
        ib_rate_gbps=ib_rate,
        link_layer=layer,
        mtu=mtu,
        nvswitch=nvswitch,
        containers=containers,
    )


def doctor(
    sim: str | None = SimOption,
    seed: int = SeedOption,
    as_json: bool = JsonOption,
    cuda: list[str] | None = typer.Option(
        None,
        "--cuda",
        help="CUDA release(s) jobs use, e.g. 12.4 (repeat or comma-separate).",
        metavar="VERSION",
    ),
    ib_rate: float | None = typer.Option(
        None,
        "--ib-rate",
        help="Expected rate of every InfiniBand/RoCE port, Gb/s (e.g. 400).",
        metavar="GBPS",
    ),
    link_layer: str | None = typer.Option(
        None, "--link-layer", help="Expected link layer of the ports: ib or eth.", metavar="ib|eth"
    ),
    mtu: int | None = typer.Option(
        None, "--mtu", help="Expected MTU of the ports' network interfaces.", metavar="BYTES"
    ),
    nvswitch: bool | None = typer.Option(
        None, "--nvswitch/--no-nvswitch", help="Declare NVSwitches (default: detect on PCI)."
    ),
    containers: bool | None = typer.Option(
        None,
        "--containers/--no-containers",
        help="Containers are (not) used here (default: check where an engine is installed).",
    ),
    plan: Path | None = typer.Option(
        None,
        "--plan",
        help="`gpufleet plan --json` output: the port rate when no --ib-rate.",
        metavar="FILE",
    ),
    root: Path | None = typer.Option(
        None,
        "--root",
        help="Check a captured tree instead of this host (files for /proc, /sys, /etc; "
        "command outputs under .commands/); skips NVML.",
        metavar="DIR",
    ),
    readiness: bool = typer.Option(
        True,
        "--readiness/--no-readiness",
        help="Run the day-one readiness checks (with --sim: on the simulated host).",
    ),
) -> None:
    """NVML present and loadable, driver/library match, functions not found, permissions,
    persistence mode and ECC; then the readiness of this host by phase (driver, cuda,
    containers, gpudirect, network, host); each problem with a hint.

    --sim covers both parts without a GPU: the NVML checks on every simulated node, and the
    readiness checks on a healthy simulated host shaped like the first node (its driver,
    fabric manager on 8-GPU SXM boards, the catalog system's InfiniBand ports and memory, a
    container runtime), against which --cuda, --ib-rate, --link-layer and --mtu are judged.

    Exit 0 ok, 1 warnings, 2 failures (no GPU, no NVML: a failure too), 3 unknown or bad input."""
    expect = _expectations(cuda, ib_rate, link_layer, mtu, nvswitch, containers, plan)
    if root is not None and not root.is_dir():
        raise UsageError(f"--root {root}: not a directory")
    env: list[Check] = []
    reports: list[DoctorReport] = []
    facts = NvmlFacts()
    simulated: SimHost | None = None
    if root is None:
        env = check_environment(simulated=bool(sim))
        try:
            fleet = open_fleet(sim=sim, seed=seed).bounded()
        except NoDeviceError as exc:
            env.append(Check("nvml", "fail", exc.message, exc.hint))
            fleet = None
        if fleet is not None:
            try:
                reports = [check_backend(b) for b in fleet.backends]
                if fleet.backends:
                    facts = nvml_facts(fleet.backends[0])
                if sim and fleet.backends:
                    simulated = _sim_host(fleet.backends[0], facts)
            finally:
                fleet.close()
    ready: list[Check] = []
    if readiness and simulated is not None:
        ready = _sim_readiness(simulated, expect)
    elif readiness and (root is not None or not sim):
        host = Host(root, FileRunner(root)) if root is not None else Host(Path("/"), SystemRunner())
        ready = run_readiness(host, facts, expect)
    here = root.resolve().name if root else simulated.name if simulated else None
    all_checks = env + [c for r in reports for c in r.checks] + ready
    overall = overall_status(all_checks)
    if as_json:
        emit_json(
            {
                "status": overall,
                "environment": to_jsonable(env),
                "nodes": [
                    {"node": r.node, "status": r.status, "checks": to_jsonable(r.checks)}
                    for r in reports
                ],
                "readiness": {
                    "node": here or socket.gethostname(),
                    "status": overall_status(ready),
                    "checks": to_jsonable(ready),
                },
            }
        )
    else:
        _print(overall, env, reports, ready, here or "(host)")
    if overall != "ok":
        raise typer.Exit(EXIT[overall])


def _sim_host(backend: GpuBackend, facts: NvmlFacts) -> SimHost | None:
    """The simulated host of a simulated node (None when its GPUs cannot be read)."""
    try:
        model = backend.device_info(0).model if facts.gpu_count else None
    except GpufleetError:
        return None
    return sim_host(backend.node_name, model, facts)


def _sim_readiness(simulated: SimHost, expect: Expectations) -> list[Check]:
    """The readiness checks on the healthy tree of a simulated host (written to a temporary
    directory and read back as `--root` reads a captured one)."""
    if expect.nvswitch is None:
        expect = replace(expect, nvswitch=simulated.nvswitch)
    with tempfile.TemporaryDirectory(prefix="gpufleet-simhost-") as tmp:
        tree = write_tree(simulated, Path(tmp))
        return run_readiness(Host(tree, FileRunner(tree)), simulated.nvml, expect)


def _print(
    overall: str, env: list[Check], reports: list[DoctorReport], ready: list[Check], here: str
) -> None:
    table = Table(title=f"gpufleet doctor: {overall}")
    for col in ("node", "check", "status", "detail", "hint"):
        table.add_column(col, overflow="fold", no_wrap=col in ("node", "status"))

    def row(node: str, c: Check, name: str) -> None:
        status = f"[{_STYLE.get(c.status, '')}]{c.status}[/]"
        table.add_row(node, name, status, c.detail, c.hint or "")

    for c in env:
        row("(host)", c, c.name)
    for r in reports:
        for c in r.checks:
            row(r.node, c, c.name)
    for c in ready:
        row(here, c, f"{c.phase}/{c.name}")
    console.print(fit(table))


def register(app: typer.Typer) -> None:
    """Attach `gpufleet doctor`."""
    app.command("doctor")(doctor)

"""A real Slurm cluster on loopback for development and tests: munged, slurmctld and N slurmd
"nodes" on this host, everything under one directory with its own port range.

Facts this relies on (checked on Debian 12, Slurm 22.05.8, MUNGE 0.5.15):
- several slurmd on one host: ``NodeHostname=localhost NodeAddr=127.0.0.1 Port=[a-b]``, ``%n``
  in the pid/log/spool paths, ``slurmd -N NAME`` (slurm.conf(5), "Port"; slurmd(8) ``-N``);
- fake GPUs: character devices (``mknod nvidiaN c 1 3``, the same numbers as /dev/null) listed
  in gres.conf with ``AutoDetect=off``; slurmd drops a GPU GRES that has no device file;
- munged refuses a socket directory writable by group/other: it is made mode 755;
- ``AuthInfo=...,cred_expire=N`` sets how long a requeued job waits before it may start again
  (slurm.conf(5), "cred_expire": default 120 s); the dev cluster keeps the default so that the
  backend's own fix (``StartTime=now`` after a requeue) is what the tests exercise.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.schedulers.slurm import config_gen
from gpufleet.schedulers.slurm.commands import SlurmBinaries, SlurmCommands
from gpufleet.schedulers.slurm.config_gen import ClusterSpec
from gpufleet.schedulers.slurm.node_spec import NodeSpec

STATE_FILE = "devcluster.json"


def find_free_ports(count: int, lo: int = 20000, hi: int = 60000, seed: int | None = None) -> int:
    """A base port with ``count`` consecutive ports free on 127.0.0.1 (randomized start, so two
    clusters started at once rarely race for the same range)."""
    import random

    rng = random.Random(seed if seed is not None else os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(lo, hi - count)
        if all(_port_free(base + i) for i in range(count)):
            return base
    raise GpufleetError(f"no {count} consecutive free ports on 127.0.0.1 in {lo}-{hi}")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def missing_binaries(binaries: SlurmBinaries | None = None) -> list[str]:
    """Programs the dev cluster needs that are not installed."""
    b = binaries or SlurmBinaries()
    needed = (b.munged, b.slurmctld, b.slurmd, b.sbatch, b.scontrol, b.sinfo, b.squeue, b.scancel)
    search = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [p for p in needed if shutil.which(p, path=search) is None]


@dataclass
class DevCluster:
    """One running (or stopped) dev cluster; :meth:`up` starts it, :meth:`down` stops it."""

    root: Path
    nodes: int = 3
    gpus_per_node: int = 2
    gpu_type: str = "h100"
    base_port: int = 0  # slurmctld's port; 0: a free range is picked (slurmd after it)
    slurmd_ports: tuple[int, ...] = ()  # one per node; (): the ports after base_port
    binaries: SlurmBinaries = field(default_factory=SlurmBinaries)
    cluster: ClusterSpec | None = None  # default: gpu1..gpuN with gpus_per_node each
    extra_conf: Mapping[str, str] = field(default_factory=dict)
    health_check_program: str | None = None
    health_check_interval_s: int = 30
    pids: dict[str, int] = field(default_factory=dict)

    # --- paths ------------------------------------------------------------------------------
    @property
    def slurm_conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket.2"

    def env(self) -> dict[str, str]:
        """Environment for Slurm clients talking to this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    def node_names(self) -> list[str]:
        return [n.name for n in self._cluster().nodes]

    def _cluster(self) -> ClusterSpec:
        if self.cluster is None:
            self.cluster = ClusterSpec(
                tuple(
                    NodeSpec(f"gpu{i}", ((self.gpu_type, self.gpus_per_node),))
                    for i in range(1, self.nodes + 1)
                )
            )
        return self.cluster

    # --- files ------------------------------------------------------------------------------
    def write_files(self) -> None:
        """Munge key, fake GPU devices, slurm.conf, gres.conf and (if switches) topology.conf."""
        r = self.root
        for d in ("etc", "state", "spool", "log", "run", "dev", "munge", "jobs"):
            (r / d).mkdir(parents=True, exist_ok=True)
        for name in self.node_names():
            (r / "spool" / name).mkdir(exist_ok=True)
        os.chmod(r, 0o755)
        os.chmod(r / "munge", 0o755)  # munged rejects a group/other-writable socket dir
        key = r / "etc" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        cl = self._cluster()
        most = max((n.gpu_count for n in cl.nodes), default=0)
        for j in range(most):
            dev = r / "dev" / f"nvidia{j}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # char 1:3, like /dev/null
        (r / "etc" / "plugstack.conf").write_text("")
        for name, text in self.render_files().items():
            (r / "etc" / name).write_text(text)

    def render_files(self) -> dict[str, str]:
        """slurm.conf, gres.conf and (if switches) topology.conf as text, writing nothing (picks
        free ports first when none were given)."""
        r = self.root
        cl = self._cluster()
        if self.slurmd_ports and len(self.slurmd_ports) != len(cl.nodes):
            raise GpufleetError(
                f"{len(self.slurmd_ports)} slurmd port(s) for {len(cl.nodes)} node(s): "
                "give one per node, or one base port"
            )
        if not self.base_port:
            self.base_port = find_free_ports(len(cl.nodes) + 1)
        placed = config_gen.on_loopback(
            cl, self.base_port + 1, r / "dev", ports=self.slurmd_ports or None
        )
        host = socket.gethostname().split(".")[0]
        base = {
            "ClusterName": "gpufleetdev",
            "SlurmctldHost": f"{host}(127.0.0.1)",
            "SlurmctldPort": str(self.base_port),
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "CryptoType": "crypto/munge",
            "StateSaveLocation": str(r / "state"),
            "SlurmdSpoolDir": str(r / "spool" / "%n"),
            "SlurmctldPidFile": str(r / "run" / "slurmctld.pid"),
            "SlurmdPidFile": str(r / "run" / "slurmd-%n.pid"),
            "SlurmctldLogFile": str(r / "log" / "slurmctld.log"),
            "SlurmdLogFile": str(r / "log" / "slurmd-%n.log"),
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "MpiDefault": "none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/none",
            "SwitchType": "switch/none",
            "SchedulerType": "sched/builtin",
            "SchedulerParameters": "sched_interval=1",
            "PlugStackConfig": str(r / "etc" / "plugstack.conf"),
            "MinJobAge": "300",
            "KillWait": "2",
            "SlurmdTimeout": "300",  # Slurm's default (slurm.conf(5)), so (b) measures defaults
        }
        base.update(self.extra_conf)
        files = {
            "slurm.conf": config_gen.slurm_conf(
                placed,
                base,
                health_check_program=self.health_check_program,
                health_check_interval_s=self.health_check_interval_s,
            ),
            "gres.conf": config_gen.gres_conf(placed),
        }
        if placed.switches:
            files["topology.conf"] = config_gen.topology_conf(placed)
        return files

    # --- daemons ----------------------------------------------------------------------------
    def _spawn(self, tag: str, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        log = open(self.root / "log" / f"{tag}.out", "ab")  # noqa: SIM115 (child keeps it)
        try:
            p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env or self.env()),
                start_new_session=True,
                cwd=self.root,
            )
        finally:
            log.close()
        self.pids[tag] = p.pid
        self._save_state()

    def up(self, timeout_s: float = 15.0) -> DevCluster:
        """Write the files, start munged, slurmctld and every slurmd, wait until all nodes are
        idle; on failure stop what was started and raise with the last log lines."""
        missing = missing_binaries(self.binaries)
        if missing:
            raise GpufleetError(
                f"Slurm dev cluster: missing {', '.join(missing)}",
                hint="apt-get install -y slurmctld slurmd slurm-client munge",
            )
        self.write_files()
        b, r = self.binaries, self.root
        try:
            self._spawn(
                "munged",
                [
                    _which(b.munged),
                    "-F",
                    "-f",
                    f"--socket={self.munge_socket}",
                    f"--key-file={r / 'etc' / 'munge.key'}",
                    f"--pid-file={r / 'run' / 'munged.pid'}",
                    f"--log-file={r / 'log' / 'munged.log'}",
                    f"--seed-file={r / 'run' / 'munged.seed'}",
                ],
            )
            _wait(lambda: self.munge_socket.exists(), 5.0, "munged socket", self)
            self._spawn("slurmctld", [_which(b.slurmctld), "-D", "-i", "-f", str(self.slurm_conf)])
            for name in self.node_names():
                self._spawn(
                    f"slurmd-{name}",
                    [_which(b.slurmd), "-D", "-N", name, "-f", str(self.slurm_conf)],
                )
            _wait(self._all_idle, timeout_s, "all nodes idle", self)
        except BaseException:
            self.down()
            raise
        return self

    def commands(self) -> SlurmCommands:
        """This cluster's Slurm programs through the one runner (short timeout: local)."""
        return SlurmCommands(binaries=self.binaries, base_env=self.env(), timeout_s=5.0)

    def _all_idle(self) -> bool:
        for tag, pid in self.pids.items():
            if not _alive(pid):
                raise GpufleetError(
                    f"Slurm dev cluster: {tag} exited during start-up{self.log_tail()}"
                )
        try:
            p = self.commands().run([_which(self.binaries.sinfo), "-h", "-N", "-o", "%N %t"])
        except GpufleetError:
            return False
        states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.node_names())

    def down(self, timeout_s: float = 5.0) -> list[str]:
        """Stop every daemon this cluster started (TERM, then KILL after ``timeout_s``);
        returns the tags stopped."""
        self._load_state()
        if self.pids.get("slurmctld") and _alive(self.pids["slurmctld"]):
            with contextlib.suppress(GpufleetError):  # end jobs while slurmd can kill steps
                self.commands().run([_which(self.binaries.scancel), "--full", "--user=root"])
        order = [t for t in self.pids if t.startswith("slurmd-")] + ["slurmctld", "munged"]
        stopped = []
        for tag in order:
            pid = self.pids.get(tag)
            if pid and _alive(pid):
                _terminate(pid, timeout_s)
                stopped.append(tag)
        for pid in self._stray_stepds():  # job step daemons outlive slurmd
            _terminate(pid, 1.0)
        self.pids.clear()
        self._save_state()
        return stopped

    def _stray_stepds(self) -> list[int]:
        """slurmstepd processes of this cluster (their environment holds our SLURM_CONF)."""
        mark = f"SLURM_CONF={self.slurm_conf}".encode()
        out = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if not (proc / "cmdline").read_bytes().startswith(b"slurmstepd"):
                    continue
                if mark in (proc / "environ").read_bytes().split(b"\0"):
                    out.append(int(proc.name))
            except OSError:
                continue
        return out

    def status(self) -> dict[str, bool]:
        """Each daemon's tag and whether its process is alive."""
        self._load_state()
        return {tag: _alive(pid) for tag, pid in self.pids.items()}

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            tail = f.read_text(errors="replace").splitlines()[-lines:]
            if tail:
                out.append(f"\n--- {f.name}\n" + "\n".join(tail))
        return "".join(out)

    # --- state (so `down` works from another process) ---------------------------------------
    def _save_state(self) -> None:
        doc = {"pids": self.pids, "base_port": self.base_port, "nodes": self.node_names()}
        (self.root / STATE_FILE).write_text(json.dumps(doc))

    def _load_state(self) -> None:
        f = self.root / STATE_FILE
        if f.exists() and not self.pids:
            doc = json.loads(f.read_text())
            self.pids = {k: int(v) for k, v in doc.get("pids", {}).items()}
            self.base_port = int(doc.get("base_port") or 0)

    def __enter__(self) -> DevCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


def temp_cluster(**kwargs: object) -> DevCluster:
    """A dev cluster in a fresh temporary directory (mode 755 so munged accepts it)."""
    root = Path(tempfile.mkdtemp(prefix="gpufleet-slurm-"))
    return DevCluster(root=root, **kwargs)  # type: ignore[arg-type]


def _which(prog: str) -> str:
    found = shutil.which(prog, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    return found or prog


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _terminate(pid: int, timeout_s: float) -> None:
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.02)


def _wait(cond: Callable[[], bool], timeout_s: float, what: str, cluster: DevCluster) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise GpufleetError(
        f"Slurm dev cluster: timed out after {timeout_s:g} s waiting for {what}{cluster.log_tail()}"
    )


def parse_ports(text: str, what: str) -> list[int]:
    """``6817``, ``6818,6820`` or ``6818-6820`` -> the ports, each 1-65535; a clear error naming
    the option otherwise."""
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise GpufleetError(f"{what} {text!r}: expected a port, PORT,PORT or PORT-PORT")
        out.extend(range(int(lo), int(hi if sep else lo) + 1))
    bad = [p for p in out if not 1 <= p <= 65535]
    if bad or not out:
        raise GpufleetError(f"{what} {text!r}: ports must be 1-65535")
    return out


def cluster_ports(ctld: int | None, slurmd: str | None, nodes: int) -> tuple[int, tuple[int, ...]]:
    """slurmctld's port (0: pick free ones) and one slurmd port per node from the options: one
    slurmd port is the first of ``nodes`` consecutive ones; several give one per node. Ports
    must not repeat (each daemon binds its own)."""
    base = ctld or 0
    if ctld is not None and not 1 <= ctld <= 65535:
        raise GpufleetError(f"--slurmctld-port {ctld}: ports must be 1-65535")
    if slurmd is None:
        if base and base + nodes > 65535:
            raise GpufleetError(f"--slurmctld-port {ctld}: no room for {nodes} slurmd after it")
        return base, ()
    listed = parse_ports(slurmd, "--slurmd-port")
    if len(listed) == 1:
        listed = list(range(listed[0], listed[0] + nodes))
        if listed[-1] > 65535:
            raise GpufleetError(f"--slurmd-port {slurmd}: no room for {nodes} consecutive ports")
    if len(listed) != nodes:
        raise GpufleetError(
            f"--slurmd-port {slurmd}: {len(listed)} ports for {nodes} nodes (give one per node, "
            "or the first of consecutive ones)"
        )
    if len(set(listed)) != len(listed) or base in listed:
        raise GpufleetError(f"--slurmd-port {slurmd}: ports repeat (or equal --slurmctld-port)")
    if not base:
        raise GpufleetError("--slurmd-port needs --slurmctld-port too")
    return base, tuple(listed)


def main(argv: list[str] | None = None) -> int:
    """A real Slurm cluster on loopback: ``up``, ``status`` or ``down``. Prints the SLURM_CONF to
    export after ``up``; ``up --print-config`` prints the configuration it would write and
    starts nothing. Two clusters run side by side with their own --dir and ports."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="slurm-dev-cluster", description=main.__doc__)
    ap.add_argument("action", choices=("up", "down", "status"))
    ap.add_argument(
        "--dir",
        "--state-dir",
        dest="dir",
        metavar="DIR",
        default=os.environ.get("GPUFLEET_SLURM_DEV", "/tmp/gpufleet-slurm-dev"),
        help="state, spool, logs, pid files and the munge socket of this cluster "
        "(default $GPUFLEET_SLURM_DEV or /tmp/gpufleet-slurm-dev)",
    )
    ap.add_argument("--nodes", type=int, default=3, help="slurmd nodes gpu1..gpuN (default 3)")
    ap.add_argument("--gpus", type=int, default=2, help="fake GPUs per node (default 2)")
    ap.add_argument(
        "--slurmctld-port",
        type=int,
        metavar="PORT",
        help="SlurmctldPort (default: a free range picked at random, slurmd ports after it)",
    )
    ap.add_argument(
        "--slurmd-port",
        metavar="PORTS",
        help="slurmd ports: the first of --nodes consecutive ones (e.g. 7001), or one per node "
        "(7001,7005,7009 or 7001-7003); needs --slurmctld-port",
    )
    ap.add_argument(
        "--print-config",
        action="store_true",
        help="with up: print slurm.conf and gres.conf as they would be written; start nothing",
    )
    args = ap.parse_args(argv)
    root = Path(args.dir)
    if args.nodes < 1 or args.gpus < 0:
        ap.error("--nodes must be at least 1 and --gpus at least 0")
    try:
        base, slurmd = cluster_ports(args.slurmctld_port, args.slurmd_port, args.nodes)
    except GpufleetError as exc:
        ap.error(str(exc))
    cluster = DevCluster(
        root=root, nodes=args.nodes, gpus_per_node=args.gpus, base_port=base, slurmd_ports=slurmd
    )
    if args.print_config:
        if args.action != "up":
            ap.error("--print-config goes with up")
        for name, text in cluster.render_files().items():
            print(f"# ---- {name}")
            print(text, end="")
        return 0
    try:
        if args.action == "up":
            if any(cluster.status().values()):
                print(f"already running in {root}; run `down` first", file=sys.stderr)
                return 1
            busy = [p for p in (base, *slurmd) if p and not _port_free(p)]
            if busy:
                print(
                    f"error: port(s) {', '.join(map(str, busy))} in use on 127.0.0.1 (another "
                    "cluster?): give free --slurmctld-port/--slurmd-port",
                    file=sys.stderr,
                )
                return 1
            root.mkdir(parents=True, exist_ok=True)
            t0 = time.monotonic()
            cluster.up()
            print(
                f"Slurm dev cluster up in {time.monotonic() - t0:.2f} s: "
                f"nodes {', '.join(cluster.node_names())}"
            )
            print(f"export SLURM_CONF={cluster.slurm_conf}")
        elif args.action == "down":
            print("stopped: " + (", ".join(cluster.down()) or "nothing was running"))
        else:
            st = cluster.status()
            for tag, alive in st.items():
                print(f"{tag}: {'running' if alive else 'stopped'}")
            if not st:
                print(f"no dev cluster in {root}")
            return 0 if st and all(st.values()) else 3
    except GpufleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

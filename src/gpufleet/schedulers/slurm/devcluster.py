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
from gpufleet.schedulers.slurm.config_gen import ClusterSpec, NodeSpec

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
    base_port: int = 0
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
        if not self.base_port:
            self.base_port = find_free_ports(len(cl.nodes) + 1)
        most = max((n.gpu_count for n in cl.nodes), default=0)
        for j in range(most):
            dev = r / "dev" / f"nvidia{j}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # char 1:3, like /dev/null
        placed = config_gen.on_loopback(cl, self.base_port + 1, r / "dev")
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
        (r / "etc" / "plugstack.conf").write_text("")
        self.slurm_conf.write_text(
            config_gen.slurm_conf(
                placed,
                base,
                health_check_program=self.health_check_program,
                health_check_interval_s=self.health_check_interval_s,
            )
        )
        (r / "etc" / "gres.conf").write_text(config_gen.gres_conf(placed))
        if placed.switches:
            (r / "etc" / "topology.conf").write_text(config_gen.topology_conf(placed))

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


def main(argv: list[str] | None = None) -> int:
    """``python -m gpufleet.schedulers.slurm.devcluster up|down|status [--dir DIR] [--nodes N]``;
    prints the SLURM_CONF to export after ``up``."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="slurm-dev-cluster", description=main.__doc__)
    ap.add_argument("action", choices=("up", "down", "status"))
    ap.add_argument(
        "--dir", default=os.environ.get("GPUFLEET_SLURM_DEV", "/tmp/gpufleet-slurm-dev")
    )
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=2, help="fake GPUs per node")
    args = ap.parse_args(argv)
    root = Path(args.dir)
    cluster = DevCluster(root=root, nodes=args.nodes, gpus_per_node=args.gpus)
    try:
        if args.action == "up":
            if any(cluster.status().values()):
                print(f"already running in {root}; run `down` first", file=sys.stderr)
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

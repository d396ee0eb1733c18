"""Slurm client commands as argument lists (never a shell), with configurable binary paths and an
injectable runner, so tests can check every argument list without a cluster. Every Slurm program
gpufleet runs (the backend, ``gpufleet health --slurm-drain``, the dev cluster) goes through
`SlurmCommands.run`: one runner, one translation of failures into clear errors.

Argument syntax from the Slurm 22.05 man pages: sbatch(1) (``--parsable`` prints ``ID[;cluster]``,
``--gres``, ``--requeue``, ``--wrap``), scontrol(1) (``update NodeName=... State=DRAIN
Reason=...``, ``requeue``, ``update JobId=... StartTime=now``), sinfo(1)/squeue(1) ``--json``,
scancel(1).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet.errors import GpufleetError
from gpufleet.schedulers.base import JobSpec
from gpufleet.schedulers.slurm.errors import translate
from gpufleet.wire.limits import NODE_NAME_RULE, is_node_name


@dataclass(frozen=True)
class SlurmBinaries:
    """Paths (or names on PATH) of the Slurm and MUNGE programs gpufleet runs."""

    sbatch: str = "sbatch"
    scontrol: str = "scontrol"
    sinfo: str = "sinfo"
    squeue: str = "squeue"
    scancel: str = "scancel"
    slurmctld: str = "slurmctld"
    slurmd: str = "slurmd"
    munged: str = "munged"

    @classmethod
    def in_dir(cls, bindir: str, sbindir: str | None = None) -> SlurmBinaries:
        """Client programs under ``bindir``, daemons under ``sbindir`` (default: same)."""
        s = sbindir or bindir
        j = os.path.join
        return cls(
            *(j(bindir, n) for n in ("sbatch", "scontrol", "sinfo", "squeue", "scancel")),
            *(j(s, n) for n in ("slurmctld", "slurmd", "munged")),
        )


@dataclass(frozen=True)
class CommandResult:
    """What one program run returned."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], Mapping[str, str], float], CommandResult]


def subprocess_runner(
    argv: Sequence[str], env: Mapping[str, str], timeout_s: float
) -> CommandResult:
    """Run ``argv`` (no shell) with exactly ``env``; a missing program or a timeout becomes a
    :class:`GpufleetError` naming the program."""
    try:
        p = subprocess.run(
            list(argv),
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError as exc:
        raise GpufleetError(
            f"{argv[0]}: not found", hint="install slurm-client or set the Slurm binary paths"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise GpufleetError(f"{shlex.join(argv)}: no answer within {timeout_s:g} s") from exc
    return CommandResult(tuple(argv), p.returncode, p.stdout, p.stderr)


MAX_REASON_CHARS = 200  # keep sinfo -R readable


def reason_text(text: str) -> str:
    """A drain reason cut to ``MAX_REASON_CHARS`` (with ``...`` when cut)."""
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def node_arg(node: str) -> str:
    """``NodeName=<node>`` for one node: a name outside the node-name rule is refused, since
    scontrol would read ``gpu[001-128]`` or ``a,b`` as many nodes (and a space or ``=`` as
    another argument)."""
    if not is_node_name(node):
        raise GpufleetError(f"refusing to name node {node[:80]!r} to Slurm: {NODE_NAME_RULE}")
    return f"NodeName={node}"


def gres_arg(gpus: int, gres_type: str | None = None) -> str:
    """``--gres=gpu:N`` or ``--gres=gpu:TYPE:N``."""
    return f"--gres=gpu:{gres_type}:{gpus}" if gres_type else f"--gres=gpu:{gpus}"


def job_script(spec: JobSpec) -> str:
    """The batch script body for ``--wrap``: the command argument list quoted for sh (run with
    ``exec``, so the job's own process is the batch shell and a checkpoint signal sent to it,
    ``scancel --batch --signal``, reaches the job itself), or a sleep of ``duration_s`` for a
    job that only occupies GPUs."""
    if spec.command:
        return "exec " + shlex.join(spec.command)
    if spec.duration_s is not None:
        return f"sleep {spec.duration_s:g}"
    raise GpufleetError(f"job {spec.name!r}: give a command or a duration")


# What a job inherits from the controller's environment besides its own variables (sbatch
# runs with it and --export=ALL passes it on); Slurm adds its SLURM_* job variables itself.
JOB_BASE_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "SHELL"})
JOB_PREFIXES = ("LC_", "SLURM_")


@dataclass(frozen=True)
class SlurmCommands:
    """Builds argument lists and runs them through ``runner`` with ``SLURM_CONF`` set."""

    binaries: SlurmBinaries = field(default_factory=SlurmBinaries)
    runner: Runner = subprocess_runner
    slurm_conf: str | None = None
    base_env: Mapping[str, str] | None = None  # default: this process's environment
    timeout_s: float = 30.0

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if self.base_env is None else self.base_env)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        env.update(extra or {})
        return env

    def job_env(self, job: Mapping[str, str]) -> dict[str, str]:
        """The environment of ``sbatch`` for a job, which ``--export=ALL`` hands to the job:
        the job's own variables over the few a shell needs (`JOB_BASE_ENV`, ``LC_*``,
        ``SLURM_*``), never the rest of the controller's (its tokens, database URL, cloud
        credentials)."""
        base = os.environ if self.base_env is None else self.base_env
        env = {k: v for k, v in base.items() if k in JOB_BASE_ENV or k.startswith(JOB_PREFIXES)}
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        env.update(job)
        return env

    def run(
        self,
        argv: Sequence[str],
        extra_env: Mapping[str, str] | None = None,
        *,
        job_env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run one argument list; a non-zero exit becomes a clear gpufleet error.
        ``job_env``: a submission, run with `job_env` instead of this process's environment."""
        env = self.job_env(job_env) if job_env is not None else self.env(extra_env)
        res = self.runner(argv, env, self.timeout_s)
        if res.returncode != 0:
            raise translate(res.argv, res.returncode, res.stderr, res.stdout)
        return res

    # --- argument lists -------------------------------------------------------------------
    def sbatch_args(
        self,
        spec: JobSpec,
        gres_type: str | None = None,
        partition: str | None = None,
        output_dir: str | None = None,
    ) -> list[str]:
        """sbatch argument list for ``spec`` (env is passed through the process environment,
        `job_env`, with ``--export=ALL``, so values may hold commas)."""
        args = [self.binaries.sbatch, "--parsable", f"--job-name={spec.name}"]
        if partition:
            args.append(f"--partition={partition}")
        args += [f"--nodes={spec.nodes}", gres_arg(spec.gpus, gres_type)]
        args.append("--requeue")  # gpufleet's failover requeues jobs; Slurm needs them requeueable
        if spec.checkpoint_dir:
            args.append(f"--chdir={spec.checkpoint_dir}")
        if output_dir:
            args.append(f"--output={output_dir.rstrip('/')}/slurm-%j.out")
        args += [f"--comment=tenant={spec.tenant}", "--export=ALL"]
        args.append(f"--wrap={job_script(spec)}")
        return args

    def drain_args(self, node: str, reason: str) -> list[str]:
        return [
            self.binaries.scontrol,
            "update",
            node_arg(node),
            "State=DRAIN",
            f"Reason={reason}",
        ]

    def resume_args(self, node: str) -> list[str]:
        return [self.binaries.scontrol, "update", node_arg(node), "State=RESUME"]

    def requeue_args(self, job_id: str) -> list[str]:
        return [self.binaries.scontrol, "requeue", job_id]

    def start_now_args(self, job_id: str) -> list[str]:
        """Clear the begin time a requeue sets (now + cred_expire + 1, 121 s by default)."""
        return [self.binaries.scontrol, "update", f"JobId={job_id}", "StartTime=now"]

    def signal_args(self, job_id: str, signal: str) -> list[str]:
        """Signal the job's batch shell only (scancel(1) ``--batch``: the script decides what
        to forward, as with ``sbatch --signal=B:SIG@TIME``)."""
        name = signal.upper().removeprefix("SIG")
        return [self.binaries.scancel, "--batch", f"--signal={name}", job_id]

    def cancel_args(self, job_id: str) -> list[str]:
        return [self.binaries.scancel, job_id]

    def sinfo_args(self) -> list[str]:
        return [self.binaries.sinfo, "--json"]

    def squeue_args(self) -> list[str]:
        return [self.binaries.squeue, "--json"]

    def show_job_args(self, job_id: str) -> list[str]:
        return [self.binaries.scontrol, "show", "job", job_id]

    def ping_args(self) -> list[str]:
        return [self.binaries.scontrol, "ping"]

"""The scheduler backends by name: what ``gpufleet controller --scheduler NAME`` and
``gpufleet up`` build. One table; an unknown name is a usage error naming ``--scheduler`` and
listing the known ones. Each factory imports its backend lazily (the Kubernetes client is slow
to import and not needed by the others)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.errors import UsageError
from gpufleet.schedulers.base import NoScheduler, SchedulerBackend


@dataclass(frozen=True)
class SchedulerOptions:
    """Settings a backend may need (CLI options map onto these; each backend reads its own)."""

    slurm_conf: str | None = None  # --slurm-conf (default: Slurm's own)
    slurm_output_dir: str | None = None  # where Slurm writes job output (for the logs API)
    kubeconfig: str | None = None  # --kubeconfig (default: in-cluster, then ~/.kube/config)


def _embedded(options: SchedulerOptions) -> SchedulerBackend:
    from gpufleet.schedulers.embedded.backend import EmbeddedBackend

    return EmbeddedBackend()


def _slurm(options: SchedulerOptions) -> SchedulerBackend:
    from gpufleet.schedulers.slurm.backend import SlurmBackend

    return SlurmBackend(slurm_conf=options.slurm_conf, output_dir=options.slurm_output_dir)


def _kubernetes(options: SchedulerOptions) -> SchedulerBackend:
    from gpufleet.schedulers.kubernetes.backend import KubernetesScheduler

    return KubernetesScheduler.from_config(options.kubeconfig)


def _none(options: SchedulerOptions) -> SchedulerBackend:
    return NoScheduler()


@dataclass(frozen=True)
class SchedulerEntry:
    """One backend the CLI can choose: its name, a line of help, and how to build it."""

    name: str
    summary: str
    factory: Callable[[SchedulerOptions], SchedulerBackend]


SCHEDULERS: dict[str, SchedulerEntry] = {
    e.name: e
    for e in (
        SchedulerEntry("embedded", "gpufleet's own scheduler; jobs run by the agents", _embedded),
        SchedulerEntry("slurm", "drain/resume/requeue and jobs through Slurm's commands", _slurm),
        SchedulerEntry(
            "kubernetes", "cordon, evict GPU pods and taint nodes (--kubeconfig)", _kubernetes
        ),
        SchedulerEntry("none", "no scheduler: drains complete at once, no jobs API", _none),
    )
}


def scheduler_names() -> list[str]:
    return list(SCHEDULERS)


def check_scheduler_name(name: str) -> SchedulerEntry:
    """The entry for ``name``, or a usage error naming ``--scheduler`` and the known names."""
    entry = SCHEDULERS.get(name)
    if entry is None:
        raise UsageError(f"--scheduler {name!r}: unknown scheduler; known: {', '.join(SCHEDULERS)}")
    return entry


def make_scheduler(name: str, options: SchedulerOptions | None = None) -> SchedulerBackend:
    """Build the backend registered as ``name``."""
    return check_scheduler_name(name).factory(options or SchedulerOptions())


def scheduler_help() -> str:
    """``--scheduler`` help text: every name with its summary."""
    return "; ".join(f"{e.name}: {e.summary}" for e in SCHEDULERS.values())

"""Slurm's error text turned into clear gpufleet errors.

The patterns are the messages Slurm 22.05 prints (``slurm_strerror`` texts from
``src/common/slurm_errno.c``, e.g. "Invalid node name specified", "Invalid job id specified"),
seen on stderr of scontrol, sbatch, scancel, sinfo and squeue.
"""

from __future__ import annotations

import re
import shlex

from gpufleet.errors import GpufleetError, UnknownNameError, UsageError


class SlurmError(GpufleetError):
    """A Slurm command failed; ``argv`` and Slurm's own text are kept for the record."""

    def __init__(
        self, message: str, *, argv: tuple[str, ...] = (), stderr: str = "", hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.argv = argv
        self.stderr = stderr


class SlurmUnknownNodeError(UnknownNameError):
    """Slurm does not know a node name."""


class SlurmUnknownJobError(UnknownNameError):
    """Slurm does not know a job id (never submitted, or already purged: MinJobAge)."""


class SlurmUnavailableError(SlurmError):
    """slurmctld cannot be reached (not running, wrong SLURM_CONF, or MUNGE down)."""


def _arg_value(argv: tuple[str, ...], key: str) -> str | None:
    for a in argv:
        k, sep, v = a.partition("=")
        if sep and k.lower() == key.lower():
            return v
    return None


def _job_id(argv: tuple[str, ...]) -> str:
    v = _arg_value(argv, "JobId")
    if v:
        return v
    return argv[-1] if len(argv) > 1 else "?"


# (pattern on stderr, builder of the error)
def translate(
    argv: tuple[str, ...], returncode: int, stderr: str, stdout: str = ""
) -> GpufleetError:
    """One clear error for a failed Slurm command."""
    text = stderr.strip() or stdout.strip() or f"exit status {returncode}"
    low = text.lower()
    prog = argv[0].rsplit("/", 1)[-1] if argv else "slurm"
    if "invalid node name specified" in low:
        node = _arg_value(argv, "NodeName") or "?"
        return SlurmUnknownNodeError("Slurm node", node, [])
    if "invalid job id specified" in low:
        return SlurmUnknownJobError("Slurm job", _job_id(argv), [])
    if (
        "unable to contact slurm controller" in low
        or "connection refused" in low
        or ("munge" in low and ("socket" in low or "credential" in low))
    ):
        return SlurmUnavailableError(
            f"{prog}: cannot reach slurmctld",
            argv=argv,
            stderr=text,
            hint="is slurmctld (and munged) running, and is SLURM_CONF right?",
        )
    if "requested node configuration is not available" in low:
        return SlurmError(
            f"{prog}: no node can ever satisfy this job (GPUs, nodes or type)",
            argv=argv,
            stderr=text,
            hint="check --gres against the nodes' Gres= in slurm.conf",
        )
    if "invalid generic resource (gres) specification" in low:
        return UsageError(f"{prog}: invalid GPU request: {text}")
    no_requeue = "requeue" in low and "disabled" in low
    if "only batch jobs are accepted or processed" in low or no_requeue:
        return SlurmError(f"{prog}: job cannot be requeued", argv=argv, stderr=text)
    if "is pending execution" in low or "no longer pending execution" in low:
        return SlurmError(
            f"{prog}: job {_job_id(argv)} is not in a state that allows this",
            argv=argv,
            stderr=text,
            hint=text,
        )
    if "job/step already completing or completed" in low or "already completed" in low:
        return SlurmError(f"{prog}: job {_job_id(argv)} already completed", argv=argv, stderr=text)
    if "access/permission denied" in low:
        return SlurmError(
            f"{prog}: permission denied",
            argv=argv,
            stderr=text,
            hint="drain, resume and requeue need a Slurm operator or root",
        )
    m = re.search(r"error:\s*(.*)", text, flags=re.IGNORECASE)
    detail = m.group(1).strip() if m else text.splitlines()[-1]
    return SlurmError(
        f"{prog} failed: {detail}", argv=argv, stderr=text, hint=f"command: {shlex.join(argv)}"
    )

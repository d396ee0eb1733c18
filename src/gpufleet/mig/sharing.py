"""GPU sharing without MIG: device-plugin time-slicing and MPS configs, bare-metal MPS commands.

Kubernetes (NVIDIA k8s-device-plugin config file, ``version: v1``; GPU Operator docs
"Time-Slicing GPUs in Kubernetes", docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/
gpu-sharing.html, and the k8s-device-plugin README "Shared Access to GPUs"):
``sharing.timeSlicing.resources[]`` / ``sharing.mps.resources[]`` with ``name`` and
``replicas``; each GPU is advertised ``replicas`` times. With MPS the plugin splits memory and
compute evenly among replicas.

Bare metal (NVIDIA Multi-Process Service, "Appendix: Tools and Interface Reference",
docs.nvidia.com/deploy/mps/appendix-tools-and-interface-reference.html):
``nvidia-cuda-mps-control -d`` starts the control daemon, ``echo quit | nvidia-cuda-mps-control``
stops it; ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY`` place its pipes and logs;
a client's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps its share of SMs and
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="<dev>=<size>"`` caps its device memory. The same guide
recommends EXCLUSIVE_PROCESS compute mode (``nvidia-smi -c EXCLUSIVE_PROCESS``) under MPS.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import ConfigError, ParseError

__all__ = [
    "MpsClient",
    "mps_commands",
    "mps_config",
    "parse_mps_clients",
    "time_slicing_config",
]

GPU_RESOURCE = "nvidia.com/gpu"


def _resource(resource: str, replicas: int, rename: str | None) -> dict[str, Any]:
    """One ``resources[]`` entry: ``resource`` advertised ``replicas`` (at least 2) times."""
    if replicas < 2:
        raise ConfigError(f"replicas: {replicas}: sharing needs at least 2 replicas per GPU")
    res: dict[str, Any] = {"name": resource, "replicas": replicas}
    if rename:
        res["rename"] = rename
    return res


def time_slicing_config(
    replicas: int,
    *,
    resource: str = GPU_RESOURCE,
    rename: str | None = None,
    fail_requests_greater_than_one: bool = False,
    mig_strategy: str = "none",
) -> dict[str, Any]:
    """Device-plugin config advertising each GPU ``replicas`` times, time-sliced."""
    res = _resource(resource, replicas, rename)
    return {
        "version": "v1",
        "flags": {"migStrategy": mig_strategy},
        "sharing": {
            "timeSlicing": {
                "renameByDefault": False,
                "failRequestsGreaterThanOne": fail_requests_greater_than_one,
                "resources": [res],
            }
        },
    }


def mps_config(
    replicas: int, *, resource: str = GPU_RESOURCE, rename: str | None = None
) -> dict[str, Any]:
    """Device-plugin config sharing each GPU among ``replicas`` MPS clients."""
    res = _resource(resource, replicas, rename)
    return {
        "version": "v1",
        "sharing": {"mps": {"renameByDefault": False, "resources": [res]}},
    }


@dataclass(frozen=True)
class MpsClient:
    """One MPS client: its name, SM share (percent) and pinned device-memory limit."""

    name: str
    thread_percentage: int
    memory_limit_bytes: int | None = None


_SIZE = re.compile(r"^(\d+)\s*([MG])i?B?$", re.I)


def _size(text: str, where: str) -> int:
    m = _SIZE.match(text.strip())
    if m is None:
        raise ParseError("--client", where, f"memory {text!r}: expected e.g. 20G or 512M")
    return int(m[1]) * (2**30 if m[2].upper() == "G" else 2**20)


def parse_mps_clients(specs: list[str]) -> list[MpsClient]:
    """``NAME:PCT[:MEM]`` each, e.g. ``infer:50:40G``."""
    out = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[1].rstrip("%").isdigit():
            raise ParseError("--client", repr(spec), "expected NAME:PERCENT[:MEMORY]")
        pct = int(parts[1].rstrip("%"))
        if not 1 <= pct <= 100:
            raise ParseError("--client", repr(spec), f"thread percentage {pct} not in 1..100")
        mem = _size(parts[2], repr(spec)) if len(parts) == 3 else None
        out.append(MpsClient(parts[0], pct, mem))
    if not out:
        raise ConfigError("--client: give at least one MPS client")
    return out


def _mem_arg(n: int) -> str:
    return f"{n // 2**30}G" if n % 2**30 == 0 else f"{n // 2**20}M"


# One MPS control daemon per GPU needs its own pipe and log directories: two daemons sharing
# CUDA_MPS_PIPE_DIRECTORY talk over the same control pipe (the MPS guide's multi-daemon setup).
PIPE_DIR = "/tmp/nvidia-mps-{gpu}"
LOG_DIR = "/var/log/nvidia-mps-{gpu}"


def mps_dirs(device: int, pipe_dir: str = PIPE_DIR, log_dir: str = LOG_DIR) -> tuple[str, str]:
    """The pipe and log directories of the daemon of GPU ``device`` (``{gpu}`` filled in);
    a template without ``{gpu}`` is refused, since it would be shared by every GPU's daemon."""
    for option, template in (("--pipe-dir", pipe_dir), ("--log-dir", log_dir)):
        if "{gpu}" not in template:
            raise ConfigError(
                f"{option} {template!r}: include {{gpu}} (e.g. /tmp/nvidia-mps-{{gpu}}): "
                "each GPU's MPS daemon needs its own directory"
            )
    return pipe_dir.replace("{gpu}", str(device)), log_dir.replace("{gpu}", str(device))


def mps_commands(
    device: int,
    clients: list[MpsClient],
    *,
    pipe_dir: str = PIPE_DIR,
    log_dir: str = LOG_DIR,
    gpu_memory_bytes: int | None = None,
) -> dict[str, Any]:
    """Shell lines to start, check and stop MPS on one GPU, and each client's environment."""
    pipe_dir, log_dir = mps_dirs(device, pipe_dir, log_dir)
    env = {
        "CUDA_VISIBLE_DEVICES": str(device),
        "CUDA_MPS_PIPE_DIRECTORY": pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": log_dir,
    }
    exports = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    start = [
        *exports,
        f"mkdir -p {shlex.quote(pipe_dir)} {shlex.quote(log_dir)}",
        f"nvidia-smi -i {device} -c EXCLUSIVE_PROCESS",
        "nvidia-cuda-mps-control -d",
    ]
    stop = [*exports, "echo quit | nvidia-cuda-mps-control", f"nvidia-smi -i {device} -c DEFAULT"]
    check = [*exports, "echo get_server_list | nvidia-cuda-mps-control"]
    per_client = []
    warnings = []
    for c in clients:
        cenv = {**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(c.thread_percentage)}
        if c.memory_limit_bytes is not None:
            # the limit names the device as the client sees it: index 0 of CUDA_VISIBLE_DEVICES
            cenv["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={_mem_arg(c.memory_limit_bytes)}"
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in cenv.items())
        per_client.append({"name": c.name, "env": cenv, "run": f"{prefix} <command>"})
    limits = [c.memory_limit_bytes for c in clients if c.memory_limit_bytes is not None]
    if gpu_memory_bytes is not None and sum(limits) > gpu_memory_bytes:
        warnings.append(
            f"memory limits add up to {sum(limits) / 2**30:.0f} GiB, more than the GPU's "
            f"{gpu_memory_bytes / 2**30:.0f} GiB: clients can still run out together"
        )
    if sum(c.thread_percentage for c in clients) > 100:
        warnings.append(
            "thread percentages add up to more than 100: each is a cap, not a reservation, "
            "so clients will contend for SMs"
        )
    return {
        "device": device,
        "start": start,
        "stop": stop,
        "check": check,
        "pipe_dir": pipe_dir,
        "log_dir": log_dir,
        "clients": per_client,
        "warnings": warnings,
    }

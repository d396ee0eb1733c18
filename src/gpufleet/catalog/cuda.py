"""Minimum NVIDIA drivers per CUDA release (catalog ``data/cuda.yaml``, with its source), and
what a driver needs to run a release: natively, through minor version compatibility, or only
with the forward compatibility package."""

from __future__ import annotations

import functools
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from gpufleet.errors import CatalogError, ConfigError


class CudaRelease(BaseModel):
    """One CUDA major.minor and the drivers it needs (Linux x86_64)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cuda: str
    min_driver: str
    minor_compat_driver: str

    @field_validator("cuda", "min_driver", "minor_compat_driver")
    @classmethod
    def _dotted(cls, v: str) -> str:
        if not all(p.isdigit() for p in v.split(".")):
            raise ValueError(f"{v!r} is not a dotted version")
        return v


class CudaTable(BaseModel):
    """The table and its source."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    releases: list[CudaRelease]

    def release(self, cuda: str) -> CudaRelease:
        """The row of ``cuda`` (``12.4``, ``12.4.1`` or ``12``: the newest 12.x), or a
        ConfigError naming the known releases."""
        parts = cuda.strip().split(".")
        if not all(p.isdigit() for p in parts) or not parts[0]:
            raise ConfigError(f"--cuda {cuda!r}: expected a CUDA version like 12.4")
        want = ".".join(parts[:2])
        rows = [r for r in self.releases if r.cuda == want]
        if len(parts) == 1:
            rows = [r for r in self.releases if r.cuda.split(".")[0] == parts[0]][-1:]
        if not rows:
            known = ", ".join(r.cuda for r in self.releases)
            raise ConfigError(
                f"--cuda {cuda}: not in the catalog's CUDA table", hint=f"known: {known}"
            )
        return rows[0]


def _tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def driver_support(driver: str, release: CudaRelease) -> str:
    """How ``driver`` runs ``release``: "native" (at or above the toolkit's driver), "minor"
    (same major through minor version compatibility) or "forward" (needs the forward
    compatibility package)."""
    have = _tuple(driver)
    if have >= _tuple(release.min_driver):
        return "native"
    if have >= _tuple(release.minor_compat_driver):
        return "minor"
    return "forward"


def driver_branch(driver: str) -> int | None:
    """The branch of a driver version (550 for ``550.54.14``); None when it is not a dotted
    version."""
    parts = driver.strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0])


def driver_cuda(driver: str, table: CudaTable | None = None) -> CudaRelease | None:
    """The CUDA release a driver reports (NVML's ``nvmlSystemGetCudaDriverVersion``,
    nvidia-smi's "CUDA Version": the newest CUDA the driver runs natively): the newest row whose
    minimum driver is of the driver's branch or an older one, as every driver of a branch reports
    its branch's CUDA (R550: 12.4, R580: 13.0). A branch with no toolkit row of its own (R565
    reports 12.7) gets the newest row below it, a lower bound; a branch newer than the table's
    newest row, that row (a lower bound too). None: not a dotted version, or a branch older
    than the table's oldest row (CUDA 11.0)."""
    branch = driver_branch(driver)
    if branch is None:
        return None
    rows = (table or load_cuda_table()).releases
    known = [r for r in rows if (driver_branch(r.min_driver) or 0) <= branch]
    return max(known, key=lambda r: _tuple(r.cuda), default=None)


def pair_problem(driver: str, cuda: str, table: CudaTable | None = None) -> str | None:
    """Why a node cannot report driver ``driver`` with CUDA ``cuda`` (a ``major.minor`` of the
    table), or None when it can or the table cannot tell (a CUDA release or a driver the table
    does not know). A driver reports one CUDA version, its own (`driver_cuda`): an older CUDA
    is never what it reports, a newer one needs a newer driver."""
    table = table or load_cuda_table()
    parts = cuda.strip().split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    want = next((r for r in table.releases if _tuple(r.cuda) == _tuple(cuda)), None)
    if want is None or driver_branch(driver) is None:
        return None
    have = driver_cuda(driver, table)
    if have is not None and _tuple(have.cuda) == _tuple(want.cuda):
        return None
    source = "NVIDIA CUDA Toolkit Release Notes, Table 3"
    branch = f"driver {driver} (R{driver_branch(driver)})"
    if have is None or _tuple(have.cuda) < _tuple(want.cuda):
        most = "no CUDA release of the table" if have is None else f"CUDA {have.cuda} at most"
        needs = f"CUDA {want.cuda} needs driver >= {want.min_driver}"
        return f"{needs}; {branch} supports {most} ({source})"
    exact = driver_branch(have.min_driver) == driver_branch(driver)
    reports = f"CUDA {have.cuda}" if exact else f"CUDA {have.cuda} or newer"
    return f"{branch} reports {reports}, the newest it supports, never {want.cuda} ({source})"


def nvml_cuda_version(release: CudaRelease) -> int:
    """The release as NVML encodes it: 1000 * major + 10 * minor (12.4 -> 12040)."""
    major, minor = _tuple(release.cuda)[:2]
    return 1000 * major + 10 * minor


@functools.cache
def load_cuda_table() -> CudaTable:
    """The packaged table, validated. Cached."""
    name = "cuda.yaml"
    text = resources.files("gpufleet.catalog").joinpath("data", name).read_text(encoding="utf-8")
    try:
        return CudaTable.model_validate(yaml.safe_load(text))
    except (yaml.YAMLError, ValidationError) as exc:
        raise CatalogError(f"catalog/data/{name}: {exc}") from exc

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


@functools.cache
def load_cuda_table() -> CudaTable:
    """The packaged table, validated. Cached."""
    name = "cuda.yaml"
    text = resources.files("gpufleet.catalog").joinpath("data", name).read_text(encoding="utf-8")
    try:
        return CudaTable.model_validate(yaml.safe_load(text))
    except (yaml.YAMLError, ValidationError) as exc:
        raise CatalogError(f"catalog/data/{name}: {exc}") from exc

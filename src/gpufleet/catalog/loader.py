"""Loads the packaged catalog data files into typed records, once, and answers lookups."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gpufleet.catalog.models import (
    GpuModel,
    MigGeometry,
    PerformanceModel,
    SystemModel,
    XidEntry,
)
from gpufleet.errors import CatalogError, ConfigError, UnknownNameError

T = TypeVar("T", bound=BaseModel)


def _read_yaml(name: str) -> Any:
    text = resources.files("gpufleet.catalog").joinpath("data", name).read_text(encoding="utf-8")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"catalog/data/{name}: not valid YAML: {exc}") from exc


def _records(name: str, key: str, cls: type[T]) -> list[T]:
    doc = _read_yaml(name)
    items = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise CatalogError(f"catalog/data/{name}: expected a top-level list {key!r}")
    out: list[T] = []
    for i, item in enumerate(items):
        try:
            out.append(cls.model_validate(item))
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            ident = (
                item.get("key") or item.get("code") or item.get("model")
                if isinstance(item, dict)
                else i
            )
            raise CatalogError(
                f"catalog/data/{name}: {key}[{i}] ({ident}): {loc}: {first['msg']}"
            ) from exc
    return out


def _performance(gpus: dict[str, GpuModel]) -> PerformanceModel:
    name = "performance.yaml"
    doc = _read_yaml(name)
    item = doc.get("performance") if isinstance(doc, dict) else None
    try:
        perf = PerformanceModel.model_validate(item)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise CatalogError(f"catalog/data/{name}: performance.{loc}: {first['msg']}") from exc
    ref = gpus.get(perf.reference.gpu)
    eff = ref.efficiency if ref is not None else None
    if (
        ref is None
        or eff is None
        or None
        in (
            eff.sustained_bf16_tflops,
            eff.sustained_sm_clock_mhz,
            eff.hbm_copy_gbps,
            eff.pcie_h2d_gbps,
            ref.max_sm_clock_mhz,
        )
    ):
        raise CatalogError(
            f"catalog/data/{name}: reference.gpu {perf.reference.gpu!r} needs a model with "
            "measured efficiency (sustained bf16 and its clock, HBM copy, PCIe) and a max clock"
        )
    return perf


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


@dataclass(frozen=True)
class Catalog:
    """All catalog records, indexed for lookup by key, alias, NVML name or PCI device id;
    plus the performance model (measured efficiencies)."""

    gpus: dict[str, GpuModel]
    systems: dict[str, SystemModel]
    mig: dict[str, MigGeometry]
    xids: dict[int, XidEntry]
    performance: PerformanceModel

    def gpu(self, name: str) -> GpuModel:
        """Resolve a model by key, alias, marketing or NVML name (case-insensitive)."""
        found = self.find_gpu(name)
        if found is None:
            raise UnknownNameError("GPU model", name, sorted(self.gpus))
        return found

    def find_gpu(self, name: str) -> GpuModel | None:
        n = _norm(name)
        if n in self.gpus:
            return self.gpus[n]
        for model in self.gpus.values():
            names = (*model.aliases, *model.nvml_names, model.marketing_name)
            if any(_norm(a) == n for a in names):
                return model
        return None

    def gpu_by_nvml_name(self, nvml_name: str, pci_device_id: str | None = None) -> GpuModel | None:
        """Map what NVML reports (name, and PCI device id when known) to a catalog model."""
        if pci_device_id:
            pid = "0x" + pci_device_id[2:].upper() if pci_device_id.lower().startswith("0x") else ""
            for model in self.gpus.values():
                if pid and pid in model.pci_device_ids:
                    return model
        n = nvml_name.strip()
        for model in self.gpus.values():
            if n in model.nvml_names:
                return model
        return self.find_gpu(n)

    def system(self, name: str) -> SystemModel:
        n = _norm(name)
        if n in self.systems:
            return self.systems[n]
        for s in self.systems.values():
            if _norm(s.name) == n:
                return s
        raise UnknownNameError("system", name, sorted(self.systems))

    def systems_for(self, gpu_key: str) -> list[SystemModel]:
        return [s for s in self.systems.values() if s.gpu == gpu_key]

    def mig_geometry(self, gpu_key: str) -> MigGeometry | None:
        return self.mig.get(gpu_key)

    def xid(self, code: int) -> XidEntry | None:
        return self.xids.get(code)


@functools.cache
def load_catalog() -> Catalog:
    """The packaged catalog, validated and cross-checked. Cached: call it freely."""
    gpus = {g.key: g for g in _records("gpus.yaml", "gpus", GpuModel)}
    systems = {s.key: s for s in _records("systems.yaml", "systems", SystemModel)}
    mig = {m.model: m for m in _records("mig.yaml", "geometries", MigGeometry)}
    xids = {x.code: x for x in _records("xid.yaml", "xids", XidEntry)}
    for s in systems.values():
        if s.gpu not in gpus:
            raise CatalogError(f"catalog/data/systems.yaml: {s.key}: unknown gpu {s.gpu!r}")
    for m in mig.values():
        if m.model not in gpus:
            raise CatalogError(f"catalog/data/mig.yaml: unknown model {m.model!r}")
    return Catalog(gpus=gpus, systems=systems, mig=mig, xids=xids, performance=_performance(gpus))


def gpu_key(name: str, where: str) -> str:
    """The catalog key of a GPU model name, or a `ConfigError` that names ``where`` the name
    came from (a flag, a file and field) with the did-you-mean hint."""
    try:
        return load_catalog().gpu(name).key
    except UnknownNameError as exc:
        raise ConfigError(f"{where}: {exc.message}", hint=exc.hint) from exc

"""Facts as data: GPU models, systems, MIG geometries, XID catalog; every figure with a source."""

from gpufleet.catalog.loader import Catalog, load_catalog
from gpufleet.catalog.models import (
    PRECISIONS,
    Efficiency,
    GpuLinkKind,
    GpuModel,
    MigGeometry,
    MigProfile,
    SystemModel,
    Tflops,
    XidAction,
    XidEntry,
    XidSeverity,
)

__all__ = [
    "PRECISIONS",
    "Catalog",
    "Efficiency",
    "GpuLinkKind",
    "GpuModel",
    "MigGeometry",
    "MigProfile",
    "SystemModel",
    "Tflops",
    "XidAction",
    "XidEntry",
    "XidSeverity",
    "load_catalog",
]

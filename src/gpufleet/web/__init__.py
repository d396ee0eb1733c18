"""gpufleet.web: the dashboard's static files, shipped inside the package (no CDN)."""

from __future__ import annotations

from pathlib import Path


def static_dir() -> Path:
    """The folder the control plane serves at ``/``."""
    return Path(__file__).parent / "static"

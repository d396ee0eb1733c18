"""A shared check for hand-written input files: one ConfigError naming file, line and field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import ConfigError


def assert_file_error(path: Path, body: str, load: Callable[[Path], Any], expected: str) -> None:
    """Writing ``body`` to ``path`` and loading it fails with ``<path><expected>...``."""
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value).startswith(f"{path}{expected}"), str(err.value)
    assert "Traceback" not in str(err.value)

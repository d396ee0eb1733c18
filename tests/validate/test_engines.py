"""Validate's engine registry (`gpufleet.validate.engines`): the simulator's engine is there once
`gpufleet.simvalidate` is imported (validate itself never imports it), an unknown name is a
clear error listing the known ones, and a name cannot be taken twice."""

from __future__ import annotations

import pytest

from gpufleet.errors import UsageError
from gpufleet.validate import engines


def test_the_sim_engine_registers_when_its_layer_is_imported() -> None:
    import gpufleet.simvalidate as sv

    assert "sim" in engines.engine_names() and "torch" in engines.engine_names()
    assert engines._ENGINES["sim"] is sv.SimEngine


def test_an_unknown_engine_names_the_known_ones() -> None:
    with pytest.raises(UsageError, match=r"'cuda-ish' is not registered \(known: .*torch"):
        engines.open_engine("cuda-ish")


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        engines.register_engine("torch", lambda: None)  # type: ignore[arg-type,return-value]

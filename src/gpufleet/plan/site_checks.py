"""Site checks the planner attaches to a candidate: cooling against the system's own cooling type,
floor loading against the floor's rating, and the notes on generators and rack weight.

Cooling: each catalog system records how it is cooled (``cooling`` in catalog/data/systems.yaml,
e.g. DGX H100 air per the NVIDIA DGX H100/H200 User Guide; DGX GB200 liquid, direct-to-chip). With
no ``constraints.cooling`` the plan follows the system (a generic server without a catalog system:
air). A constraint against a catalog system's cooling is planned as asked, with a warning: an
air-cooled server has no cold plates to connect a CDU to (its heat reaches water only through
rear-door or in-row heat exchangers), and a liquid-cooled system cannot shed its heat into air.
"""

from __future__ import annotations

from gpufleet.catalog.models import SystemModel
from gpufleet.plan.facility import Facility
from gpufleet.plan.plant import Plant

__all__ = ["candidate_cooling", "site_notes", "site_warnings"]


def candidate_cooling(
    constraint: str | None, system: SystemModel | None
) -> tuple[str, str | None, str | None]:
    """(cooling planned, warning or None, note or None) for ``constraint`` on ``system``."""
    own = system.cooling if system is not None else None
    if constraint is None:
        if own is None:
            return "air", None, "cooling: air (a generic server has no catalog cooling type; "
            "set constraints.cooling to plan liquid)"
        return own, None, None
    if own is None or own == constraint:
        return constraint, None, None
    assert system is not None
    src = system.sources.get("cooling", system.source)
    if constraint == "liquid":
        why = (
            f"constraints.cooling is liquid but {system.name} is air-cooled ({src}): it has no "
            "cold plates for the CDUs planned here; its heat reaches water only through rear-door "
            "or in-row heat exchangers. Set constraints.cooling: air, or leave it out to follow "
            "the system"
        )
    else:
        why = (
            f"constraints.cooling is air but {system.name} is liquid-cooled ({src}): it cannot "
            "shed its heat into room air, and this plan has no CDUs or coolant loop for it. Set "
            "constraints.cooling: liquid, or leave it out to follow the system"
        )
    return constraint, why, None


def site_warnings(fac: Facility) -> tuple[str, ...]:
    """Warnings from the facility figures: the fullest rack's floor loading above the rating."""
    if fac.floor_overloaded and fac.floor_load_kg_m2 is not None:
        return (
            f"floor loading {fac.floor_load_kg_m2:,.0f} kg/m^2 ({fac.rack_weight_kg:,.0f} kg over "
            f"{fac.rack_footprint_m2:.2f} m^2) is above the floor rating "
            f"{fac.floor_rating_kg_m2:,.0f} kg/m^2 (constraints.floor_rating_kg_m2; ANSI/TIA-942 "
            "recommends 12 kPa = 1,224 kg/m^2): put fewer servers per rack, spread the load "
            "(load-spreading plates) or have the floor rated",
        )
    return ()


def site_notes(fac: Facility, plant: Plant) -> tuple[str, ...]:
    """Notes on the rack weight and, for a small site, on who provides standby generators."""
    out = [n for n in (fac.weight_note, plant.generator_note) if n]
    return tuple(out)

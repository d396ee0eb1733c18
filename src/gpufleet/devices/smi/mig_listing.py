"""Parsers of ``nvidia-smi mig -lgip`` (GPU-instance profiles) and ``-lgipp`` (their placements),
and their combination into catalog :class:`gpufleet.catalog.MigProfile` records.

``-lgip`` prints two table lines per profile::

    |   0  MIG 1g.18gb         19     7/7        16.00      No     16     1     0   |
    |                                                               1     1     0   |

(GPU, name, profile id, instances free/total, memory GiB, P2P, SM, DEC, ENC; then CE, JPEG,
OFA). ``-lgipp`` prints ``GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1`` (``Placement :``
when there is one). Format from the H200 captures in tests/fixtures/nvidia-h200/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from gpufleet.catalog import MigProfile
from gpufleet.errors import ParseError

_LGIP_ROW = re.compile(
    r"^\|\s*(?P<gpu>\d+)\s+MIG\s+(?P<name>\S+)\s+(?P<id>\d+)\s+(?P<free>\d+)/(?P<total>\d+)\s+"
    r"(?P<mem>\S+)\s+(?P<p2p>\S+)\s+(?P<sm>\d+)\s+(?P<dec>\d+)\s+(?P<enc>\d+)\s*\|$"
)
_LGIP_ROW2 = re.compile(r"^\|\s+(?P<ce>\d+)\s+(?P<jpeg>\d+)\s+(?P<ofa>\d+)\s*\|$")
_LGIPP_ROW = re.compile(
    r"^GPU\s+(?P<gpu>\d+)\s+Profile\s+ID\s+(?P<id>\d+)\s+Placements?\s*:\s*"
    r"\{(?P<starts>[^}]*)\}:(?P<size>\d+)$"
)
_GIB_2DP = re.compile(r"^\d+(?:\.\d+)?$")
_SLICES = re.compile(r"^(\d+)g\.")


@dataclass(frozen=True)
class LgipProfile:
    """One row of ``nvidia-smi mig -lgip``."""

    gpu: int
    name: str  # without the "MIG " prefix, e.g. "1g.18gb+me"
    profile_id: int
    instances_free: int
    instances_total: int
    memory_gib: float
    p2p: bool
    sm_count: int
    decoders: int
    encoders: int
    copy_engines: int | None = None
    jpeg: int | None = None
    ofa: int | None = None


@dataclass(frozen=True)
class LgippPlacement:
    """One line of ``nvidia-smi mig -lgipp``: valid start slices and the size of a placement."""

    gpu: int
    profile_id: int
    starts: tuple[int, ...]
    size: int


def _is_decoration(line: str) -> bool:
    s = line.strip()
    if not s or set(s) <= set("+-=|"):
        return True
    if s.startswith("|") and s.endswith("|"):
        inner = s[1:-1].strip()
        return (
            inner.startswith(("GPU instance profiles", "GPU ", "Free/Total"))
            or "Free/Total" in inner
            or not inner
        )
    return False


def _is_message(line: str) -> bool:
    """nvidia-smi's one-line answers when there is nothing to list."""
    low = line.strip().lower()
    return low.startswith("no ") and ("found" in low or "mig" in low)


def parse_mig_lgip(text: str, source: str = "<string>") -> list[LgipProfile]:
    """Parse ``nvidia-smi mig -lgip``; an empty listing ("No ... found") gives ``[]``."""
    out: list[LgipProfile] = []
    for n, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        m = _LGIP_ROW.match(s)
        if m is not None:
            mem = m.group("mem")
            if not _GIB_2DP.match(mem):
                raise ParseError(source, f"line {n}", f"memory {mem!r} is not a number of GiB")
            out.append(
                LgipProfile(
                    gpu=int(m.group("gpu")),
                    name=m.group("name"),
                    profile_id=int(m.group("id")),
                    instances_free=int(m.group("free")),
                    instances_total=int(m.group("total")),
                    memory_gib=float(mem),
                    p2p=m.group("p2p").lower() == "yes",
                    sm_count=int(m.group("sm")),
                    decoders=int(m.group("dec")),
                    encoders=int(m.group("enc")),
                )
            )
            continue
        m2 = _LGIP_ROW2.match(s)
        if m2 is not None:
            if not out or out[-1].copy_engines is not None:
                raise ParseError(source, f"line {n}", "CE/JPEG/OFA line without a profile line")
            prev = out[-1]
            out[-1] = replace(
                prev,
                copy_engines=int(m2.group("ce")),
                jpeg=int(m2.group("jpeg")),
                ofa=int(m2.group("ofa")),
            )
            continue
        if _is_decoration(s) or _is_message(s):
            continue
        raise ParseError(source, f"line {n}", f"not a line of nvidia-smi mig -lgip: {s[:60]!r}")
    return out


def parse_mig_lgipp(text: str, source: str = "<string>") -> list[LgippPlacement]:
    """Parse ``nvidia-smi mig -lgipp``; an empty listing gives ``[]``."""
    out: list[LgippPlacement] = []
    for n, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or _is_message(s):
            continue
        m = _LGIPP_ROW.match(s)
        if m is None:
            raise ParseError(
                source, f"line {n}", f"not a line of nvidia-smi mig -lgipp: {s[:60]!r}"
            )
        starts_text = [p.strip() for p in m.group("starts").split(",")]
        if not all(p.isdigit() for p in starts_text):
            raise ParseError(
                source, f"line {n}", f"placements {{{m.group('starts')}}} are not slice numbers"
            )
        out.append(
            LgippPlacement(
                gpu=int(m.group("gpu")),
                profile_id=int(m.group("id")),
                starts=tuple(int(p) for p in starts_text),
                size=int(m.group("size")),
            )
        )
    return out


def combine_mig_profiles(
    lgip: list[LgipProfile], lgipp: list[LgippPlacement], gpu: int | None = None
) -> list[MigProfile]:
    """Join profiles and placements (by GPU and profile id) into catalog records.

    ``gpu`` selects one GPU's listing (default: the first GPU listed). Memory MiB is the table's
    GiB (2 decimals) * 1024, rounded; max instances is the Total column; compute slices come from
    the name (``3g.`` -> 3) and memory slices from the placement size; the engine counts are
    the DEC/ENC and CE/JPEG/OFA columns. A ``+me`` name (``1g.23gb+me``, ``1g.24gb+me.all``)
    marks the media extensions; ``-me`` (no media engines) does not.
    """
    if not lgip:
        return []
    which = gpu if gpu is not None else lgip[0].gpu
    places = {(p.gpu, p.profile_id): p for p in lgipp}
    out: list[MigProfile] = []
    for prof in lgip:
        if prof.gpu != which:
            continue
        place = places.get((which, prof.profile_id))
        if place is None:
            raise ParseError(
                "nvidia-smi mig -lgipp",
                f"GPU {which} profile {prof.profile_id} ({prof.name})",
                "no placements listed for this profile",
            )
        m = _SLICES.match(prof.name)
        if m is None:
            raise ParseError(
                "nvidia-smi mig -lgip",
                f"profile {prof.profile_id}",
                f"name {prof.name!r} is not like 3g.71gb",
            )
        out.append(
            MigProfile(
                name=prof.name,
                profile_id=prof.profile_id,
                compute_slices=int(m.group(1)),
                memory_slices=place.size,
                memory_mib=round(prof.memory_gib * 1024),
                sm_count=prof.sm_count,
                max_instances=prof.instances_total,
                placements=place.starts,
                placement_size=place.size,
                media_extensions="+me" in prof.name,
                copy_engines=prof.copy_engines,
                decoders=prof.decoders,
                encoders=prof.encoders,
                jpeg=prof.jpeg,
                ofa=prof.ofa,
            )
        )
    return out

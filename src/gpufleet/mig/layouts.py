"""Valid MIG layouts of one GPU model, enumerated from the catalog's MIG geometry.

A layout is a set of GPU instances, each a profile at one of its valid start slices
(``nvidia-smi mig -lgipp``: ``{starts}:size`` over the model's memory slices). It is valid when

- no two instances share a memory slice,
- the compute slices of its instances add up to at most the geometry's ``compute_slices`` (7),
- no profile has more instances than its ``max_instances`` (``nvidia-smi mig -lgip``),
- at most one instance holds the media extensions (a ``+me`` profile), whichever ``+me`` profile
  it is: the guide's count for a ``+me`` profile reads "1 (A single 1g profile can include media
  extensions)" and the GPU's JPEG/OFA engines go to that one instance.

Source of the rules: NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles" and
"Placement" (docs.nvidia.com/datacenter/tesla/mig-user-guide/); the figures are the catalog's.

Tools such as mig-parted name a layout by its instance counts and choose the placements
themselves, so layouts are compared by count vector; each carries one witness placement.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.catalog import load_catalog
from gpufleet.catalog.models import MigGeometry
from gpufleet.errors import ConfigError, UsageError

__all__ = [
    "MAX_MEDIA_EXTENSION_INSTANCES",
    "Layout",
    "Placement",
    "geometry_for",
    "layout_for_counts",
    "layout_space",
    "validate_placements",
]


# NVIDIA MIG User Guide, Supported MIG Profiles: every +me row's instance count is
# "1 (A single 1g profile can include media extensions)" (A30: "A single 2g profile ...").
MAX_MEDIA_EXTENSION_INSTANCES = 1


@dataclass(frozen=True, order=True)
class Placement:
    """One GPU instance: a profile at a start memory slice, spanning ``size`` slices."""

    start: int
    size: int
    profile: str

    @property
    def mask(self) -> int:
        return ((1 << self.size) - 1) << self.start


@dataclass(frozen=True)
class Layout:
    """A valid partition of one GPU of ``model`` (placements sorted by start slice)."""

    model: str
    placements: tuple[Placement, ...]
    memory_slices: int = 8
    compute_slices: int = 7
    compute_used: int = 0

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.placements:
            out[p.profile] = out.get(p.profile, 0) + 1
        return dict(sorted(out.items()))

    @property
    def key(self) -> tuple[tuple[str, int], ...]:
        return tuple(self.counts.items())

    @property
    def empty(self) -> bool:
        return not self.placements

    @property
    def memory_used(self) -> int:
        return sum(p.size for p in self.placements)

    @property
    def memory_stranded(self) -> int:
        """Memory slices no instance covers (0 on a GPU with MIG off: it is used whole)."""
        return 0 if self.empty else self.memory_slices - self.memory_used

    @property
    def compute_stranded(self) -> int:
        return 0 if self.empty else self.compute_slices - self.compute_used

    def describe(self) -> str:
        if self.empty:
            return "MIG off"
        return ", ".join(f"{n}x{p}" for p, n in self.counts.items())


def geometry_for(model: str) -> MigGeometry:
    """The MIG geometry of a catalog model (key or alias); a clear error if it has none."""
    cat = load_catalog()
    gpu = cat.gpu(model)
    geo = cat.mig_geometry(gpu.key)
    if geo is None:
        with_mig = sorted(cat.mig)
        raise UsageError(
            f"GPU model {gpu.key!r} has no MIG geometry in the catalog",
            hint=f"MIG models: {', '.join(with_mig)}",
        )
    return geo


def profile_names(models: Iterable[str]) -> list[str]:
    """Every MIG profile name the given GPU models offer (models without MIG add none)."""
    known: list[str] = []
    for model in sorted(set(models)):
        try:
            known.extend(p.name for p in geometry_for(model).profiles if p.name not in known)
        except UsageError:
            continue
    return known


def validate_placements(geo: MigGeometry, placements: list[Placement]) -> list[str]:
    """Every rule a list of placements breaks (empty when the layout is valid)."""
    problems: list[str] = []
    used = 0
    compute = 0
    media = 0
    per_profile: dict[str, int] = {}
    for pl in placements:
        prof = geo.profile(pl.profile)
        media += prof.media_extensions
        if pl.start not in prof.placements:
            problems.append(
                f"{pl.profile} cannot start at slice {pl.start} (valid: {list(prof.placements)})"
            )
        if pl.mask & used:
            problems.append(f"{pl.profile} at slice {pl.start} overlaps another instance")
        used |= pl.mask
        compute += prof.compute_slices
        per_profile[pl.profile] = per_profile.get(pl.profile, 0) + 1
    if compute > geo.compute_slices:
        problems.append(f"{compute} compute slices used, the GPU has {geo.compute_slices}")
    for name, n in per_profile.items():
        limit = geo.profile(name).max_instances
        if n > limit:
            problems.append(f"{n} instances of {name}, at most {limit}")
    if media > MAX_MEDIA_EXTENSION_INSTANCES:
        problems.append(
            f"{media} media-extension (+me) instances, at most {MAX_MEDIA_EXTENSION_INSTANCES} "
            "per GPU (the +me instance holds the GPU's media engines)"
        )
    return problems


@functools.cache
def layout_space(model_key: str) -> tuple[Layout, ...]:
    """Every distinct valid layout (by instance counts) of a model, the empty one first.

    Exhaustive depth-first search over (profile, start) candidates in a fixed order, pruned by
    overlap, compute and per-profile limits; memoised per model.
    """
    geo = geometry_for(model_key)
    cands = sorted(
        (Placement(start, p.placement_size, p.name), p.compute_slices, p.max_instances)
        for p in geo.profiles
        for start in p.placements
    )
    media = {p.name for p in geo.profiles if p.media_extensions}
    seen: dict[tuple[tuple[str, int], ...], Layout] = {}

    def visit(i: int, chosen: list[Placement], used: int, compute: int, me: int) -> None:
        layout = Layout(
            geo.model,
            tuple(chosen),
            memory_slices=geo.memory_slices,
            compute_slices=geo.compute_slices,
            compute_used=compute,
        )
        seen.setdefault(layout.key, layout)
        for j in range(i, len(cands)):
            pl, cs, limit = cands[j]
            if pl.mask & used or compute + cs > geo.compute_slices:
                continue
            if sum(1 for c in chosen if c.profile == pl.profile) >= limit:
                continue
            is_me = pl.profile in media
            if is_me and me >= MAX_MEDIA_EXTENSION_INSTANCES:
                continue
            chosen.append(pl)
            visit(j + 1, chosen, used | pl.mask, compute + cs, me + is_me)
            chosen.pop()

    visit(0, [], 0, 0, 0)
    return tuple(seen.values())


def layout_for_counts(model_key: str, counts: dict[str, int], where: str = "layout") -> Layout:
    """The valid layout with these instance counts, or a ConfigError saying why there is none."""
    geo = geometry_for(model_key)
    for name in counts:
        geo.profile(name)  # UnknownNameError with did-you-mean
    wanted = tuple(sorted((p, n) for p, n in counts.items() if n))
    for layout in layout_space(geo.model):
        if layout.key == wanted:
            return layout
    desc = ", ".join(f"{n}x{p}" for p, n in wanted)
    why = _count_problems(geo, dict(wanted))
    reason = f" ({'; '.join(why)})" if why else ""
    raise ConfigError(f"{where}: {desc} is not a valid MIG layout of {geo.model}{reason}")


def _count_problems(geo: MigGeometry, counts: dict[str, int]) -> list[str]:
    """The limits a count vector breaks whatever the placements (empty: only placement fails)."""
    out = []
    for name, n in counts.items():
        prof = geo.profile(name)
        if n > prof.max_instances:
            out.append(f"at most {prof.max_instances}x {name}")
    media = sum(n for name, n in counts.items() if geo.profile(name).media_extensions)
    if media > MAX_MEDIA_EXTENSION_INSTANCES:
        out.append(
            f"at most {MAX_MEDIA_EXTENSION_INSTANCES} media-extension (+me) instance per GPU"
        )
    compute = sum(geo.profile(name).compute_slices * n for name, n in counts.items())
    if compute > geo.compute_slices:
        out.append(f"{compute} compute slices, the GPU has {geo.compute_slices}")
    memory = sum(geo.profile(name).placement_size * n for name, n in counts.items())
    if memory > geo.memory_slices:
        out.append(f"{memory} memory slices, the GPU has {geo.memory_slices}")
    return out

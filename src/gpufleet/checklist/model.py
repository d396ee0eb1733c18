"""The deployment checklist: sections of items, each open, done (with the evidence that proves
it), warn (evidence with warnings, to review) or failed (evidence that disproves it)."""

from __future__ import annotations

from dataclasses import dataclass, field

STATES = ("done", "warn", "failed", "open")


@dataclass(frozen=True)
class Item:
    """One line to tick: what to do (with the plan's numbers), its state and the evidence."""

    key: str
    text: str
    state: str = "open"
    evidence: str | None = None


@dataclass
class Section:
    """A phase of the deployment (site, racking, cabling ...) and its items."""

    key: str
    title: str
    items: list[Item] = field(default_factory=list)

    def add(self, key: str, text: str, state: str = "open", evidence: str | None = None) -> None:
        self.items.append(Item(f"{self.key}.{key}", text, state, evidence))


SIGN_OFF_ROLES = (
    "Facilities (power, cooling, floor)",
    "Network (cabling, fabric)",
    "Systems (firmware, drivers, software)",
    "Validation (burn-in results)",
    "Acceptance (owner)",
)


@dataclass
class Checklist:
    """The whole checklist of one plan, and the evidence files it was built from."""

    name: str
    sections: list[Section]
    sources: list[str] = field(default_factory=list)
    sign_off: tuple[str, ...] = SIGN_OFF_ROLES

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATES, 0)
        for s in self.sections:
            for i in s.items:
                out[i.state] += 1
        return out

"""The deployment checklist of a plan: site, racking, cabling, baseline, software, readiness,
validation and sign-off, ticked where a supplied inventory, validation or doctor report proves
an item."""

from gpufleet.checklist.build import build_checklist
from gpufleet.checklist.model import Checklist, Item, Section
from gpufleet.checklist.render import to_html, to_markdown

__all__ = ["Checklist", "Item", "Section", "build_checklist", "to_html", "to_markdown"]

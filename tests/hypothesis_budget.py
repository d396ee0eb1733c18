"""Hypothesis profiles, so every example budget comes from one place: ``dev`` (small: the fast
tier and a developer's plain ``pytest``) and ``ci`` (the full budgets, derandomized: ``make
test``). ``GPUFLEET_HYPOTHESIS_PROFILE`` picks one; `examples` scales a test's own budget, and
`seeds` does the same for a test parametrized over hand-seeded runs."""

from __future__ import annotations

import os

from hypothesis import settings

# ci: each test's full budget, the same examples every run (a CI verdict must not depend on
# which inputs a random seed drew); dev: at most 10 examples a test, random as usual.
settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True, database=None)
settings.register_profile("dev", max_examples=10, deadline=None)

PROFILE = os.environ.get("GPUFLEET_HYPOTHESIS_PROFILE", "dev")
if PROFILE not in ("ci", "dev"):
    raise SystemExit(f"GPUFLEET_HYPOTHESIS_PROFILE: {PROFILE!r} is not one of ci, dev")
settings.load_profile(PROFILE)


def examples(ci_budget: int) -> int:
    """A test's example budget: ``ci_budget`` under the ci profile, at most the active
    profile's ``max_examples`` otherwise."""
    if PROFILE == "ci":
        return ci_budget
    active = settings.get_profile(PROFILE)
    return min(ci_budget, active.max_examples)


def seeds(ci_count: int, dev_count: int) -> range:
    """The seeds a hand-seeded randomized test runs: all ``ci_count`` under the ci profile, the
    first ``dev_count`` otherwise (such a test is a property test with its own generator)."""
    return range(ci_count if PROFILE == "ci" else min(ci_count, dev_count))

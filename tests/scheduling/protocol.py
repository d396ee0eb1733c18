"""One check every scheduler backend must pass: it implements the protocol and answers
``capabilities()`` for every feature, with a reason wherever it says no."""

from __future__ import annotations

import pytest

from gpufleet.schedulers.base import (
    Feature,
    JobSpec,
    SchedulerBackend,
    UnsupportedFeature,
)


def assert_protocol(backend: object, name: str) -> SchedulerBackend:
    assert isinstance(backend, SchedulerBackend)
    assert backend.name == name
    caps = backend.capabilities()
    answered = list(caps)
    assert [c.feature for c in answered] == list(Feature)  # every feature, in order
    for c in answered:
        assert isinstance(c.supported, bool)
        if not c.supported:
            assert c.why.strip(), f"{name}: {c.name} refused without a reason"
    if not caps.supports(Feature.SUBMIT):
        with pytest.raises(UnsupportedFeature):
            backend.submit(JobSpec(name="probe", command=("true",)))
    if not caps.supports(Feature.AGENT_JOBS):
        from gpufleet.wire import Batch

        b = Batch(node="n1", agent_id="a", seq=1, sent_at_s=0.0)
        assert backend.exchange(b, 0.0) == []
    return backend

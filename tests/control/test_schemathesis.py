"""Property-based fuzzing of every documented endpoint (schemathesis over the OpenAPI schema)
with a token of every role, tenant-bound and node-bound ones too: no 5xx and every response
matches its documented schema, whoever calls. Then stateful runs (schemathesis chains calls
through the links it infers: a job submitted, then read, cancelled, its logs fetched) for each
role. Examples are bounded."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance

from gpufleet.control.api.app import create_app
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.schedulers.registry import SchedulerOptions, make_scheduler
from tests.control.conftest import batch, push
from tests.hypothesis_budget import examples

if TYPE_CHECKING:
    from schemathesis.specs.openapi.schemas import OpenApiCase

# the embedded scheduler, so the jobs endpoints answer (with `none` they are 501 by design).
# Built at import (schemathesis reads the app's schema there) but started only while this
# module's tests run (`_running`): started at import, it ticked in every xdist worker that
# collected the module, for the worker's whole life.
_data = Path(tempfile.mkdtemp(prefix="gpufleet-st-"))
atexit.register(shutil.rmtree, _data, True)  # workers that collect but never run the module
_svc = ControlService(
    ServiceConfig(data_dir=_data), scheduler=make_scheduler("embedded", SchedulerOptions())
)


@pytest.fixture(scope="module", autouse=True)
def _running() -> Iterator[None]:
    _svc.start()
    try:
        for n in ("n1", "n2"):
            push(_svc, batch(n, 1))
        yield
    finally:
        _svc.stop()
        shutil.rmtree(_data, ignore_errors=True)


# (role, tenant, node) of each caller; a token is made again when a fuzzed DELETE revoked it
CALLERS: dict[str, tuple[str, str | None, str | None]] = {
    "admin": ("admin", None, None),
    "operator": ("operator", None, None),
    "viewer": ("viewer", None, None),
    "agent": ("agent", None, None),
    "agent-n1": ("agent", None, "n1"),
    "tenant-operator": ("operator", "t1", None),
    "tenant-viewer": ("viewer", "t1", None),
}
_tokens: dict[str, str] = {}


def token_of(caller: str) -> str:
    """A live token of ``caller``."""
    tok = _tokens.get(caller)
    if tok is None or _svc.store.tokens.resolve(tok) is None:
        role, tenant, node = CALLERS[caller]
        tok = _svc.store.tokens.create(role, name=f"fuzz-{caller}", tenant=tenant, node=node)[0]
        _tokens[caller] = tok
    return tok


app = create_app(_svc)
schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app)
CHECKS = [not_a_server_error, response_schema_conformance]
SETTINGS = settings(
    max_examples=examples(5), deadline=None, suppress_health_check=list(HealthCheck)
)


# One test per documented operation, valid and invalid inputs alike: what
# `schema.parametrize()` generates, built here from the operations so the suite does not need
# schemathesis's pytest plugin (`make test` runs pytest with plugin auto-loading off).
OPERATIONS = {}
for _r in schema.get_all_operations():
    assert isinstance(_r, Ok), f"the OpenAPI schema has an invalid operation: {_r}"
    OPERATIONS[_r.ok().label] = _r.ok()


@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_api_fuzz_every_role(label: str) -> None:
    op = OPERATIONS[label]
    cases = st.one_of(*(op.as_strategy(generation_mode=m) for m in GenerationMode))

    @SETTINGS
    @given(case=cases)
    def fuzz(case: OpenApiCase) -> None:
        for caller in CALLERS:
            case.call_and_validate(
                headers={"Authorization": f"Bearer {token_of(caller)}"}, checks=CHECKS
            )

    fuzz()


@pytest.mark.parametrize("caller", list(CALLERS))
def test_api_stateful_every_role(caller: str) -> None:
    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"headers": {"Authorization": f"Bearer {token_of(caller)}"}}

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            case.validate_response(response, checks=CHECKS)

    Workflow.run(
        settings=settings(
            max_examples=examples(4),
            stateful_step_count=5,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
    )

"""Property-based fuzzing of every documented endpoint (schemathesis over the OpenAPI schema):
no 5xx and every response matches its documented schema. Examples are bounded."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from gpufleet.control.api import create_app
from gpufleet.control.service import ControlService, ServiceConfig
from tests.control.conftest import batch, push

if TYPE_CHECKING:
    from schemathesis.specs.openapi.schemas import OpenApiCase

_svc = ControlService(ServiceConfig(data_dir=Path(tempfile.mkdtemp(prefix="gpufleet-st-"))))
_svc.ingest.start()
_ADMIN = _svc.store.tokens.create("admin", name="fuzz")[0]
for _n in ("n1", "n2"):
    push(_svc, batch(_n, 1))
app = create_app(_svc)
schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app)


@schema.parametrize()
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_fuzz(case: OpenApiCase) -> None:
    case.call_and_validate(
        headers={"Authorization": f"Bearer {_ADMIN}"},
        checks=[not_a_server_error, response_schema_conformance],
    )

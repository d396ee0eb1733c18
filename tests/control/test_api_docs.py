"""``/api/v1/docs`` is Swagger UI served wholly by the controller: every script, style and icon
the page names is a local path that answers 200, none is on another host (no CDN)."""

from __future__ import annotations

import re
from collections.abc import Callable

from starlette.testclient import TestClient

from gpufleet.control.api.app import create_app
from gpufleet.control.service import ControlService


def test_swagger_ui_loads_nothing_from_the_network(
    make_service: Callable[..., ControlService],
) -> None:
    client = TestClient(create_app(make_service()))
    page = client.get("/api/v1/docs")
    assert page.status_code == 200
    refs = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    refs += re.findall(r"""url:\s*['"]([^'"]+)['"]""", page.text)  # the OpenAPI document
    assert any(r.endswith("swagger-ui-bundle.js") for r in refs), refs
    assert "//" not in "".join(refs), refs  # no scheme or host: nothing off this server
    for ref in refs:
        assert client.get(ref).status_code == 200, ref
    assert "cdn" not in page.text.lower()

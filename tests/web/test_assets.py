"""The dashboard's files ship inside the package and reach nothing outside it: no CDN or
external URL, every ES-module import resolves to a shipped file, the control plane serves them
with the right types, and the token is only ever sent in the Authorization header."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from gpufleet.control.api.app import create_app
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.web import static_dir

STATIC = static_dir()
IMPORT = re.compile(r"""^\s*import\s[^'"]*['"](?P<p>[^'"]+)['"]""", re.M)


def _files(ext: str) -> list[Path]:
    return sorted(STATIC.rglob(f"*.{ext}"))


def test_every_asset_is_local() -> None:
    files = _files("html") + _files("css") + _files("js")
    assert len(_files("js")) >= 8, "the dashboard's modules are missing"
    for f in files:
        text = f.read_text()
        # no absolute URL to another host (protocol-relative included)
        hits = re.findall(
            r"""(?:src|href|url\(|from|import)\s*=?\s*['"(]?\s*(?:https?:)?//""", text
        )
        assert not hits, f"{f.name} loads something from outside the package: {hits}"


def test_module_imports_resolve_to_shipped_files() -> None:
    seen = 0
    for f in _files("js"):
        for m in IMPORT.finditer(f.read_text()):
            target = (f.parent / m.group("p")).resolve()
            assert m.group("p").startswith("./"), f"{f.name}: bare import {m.group('p')}"
            assert target.is_file(), f"{f.name} imports {m.group('p')}, which is not shipped"
            seen += 1
    assert seen >= 15


def test_token_only_travels_in_the_authorization_header() -> None:
    api = (STATIC / "js" / "api.js").read_text()
    assert "Authorization" in api and "Bearer " in api
    everything = "\n".join(f.read_text() for f in _files("js"))
    assert "localStorage.setItem" not in everything  # session-scoped only
    assert not re.search(r"console\.\w+\(", everything)  # nothing logged, token included
    assert "?token=" not in everything and not re.search(r"[{,]\s*token\s*:", everything)


def test_control_plane_serves_the_dashboard(tmp_path: Path) -> None:
    svc = ControlService(ServiceConfig(data_dir=tmp_path / "d"))
    try:
        with TestClient(create_app(svc)) as c:
            r = c.get("/")
            assert r.status_code == 200 and "text/html" in r.headers["content-type"]
            assert 'src="js/app.js"' in r.text and 'href="css/app.css"' in r.text
            js = c.get("/js/app.js")
            assert js.status_code == 200 and "javascript" in js.headers["content-type"]
            assert c.get("/css/app.css").headers["content-type"].startswith("text/css")
            # the static mount does not shadow the API (an unknown API path is still a 404)
            assert c.get("/api/v1/summary").status_code == 401
    finally:
        svc.engine.dispose()

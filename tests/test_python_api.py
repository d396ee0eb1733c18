"""The public Python API: lazy, documented, typed records that match the server, and every
example in docs/python-api.md runs (on the simulator and against a real `gpufleet up`)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import gpufleet
from gpufleet.client import Client, ControllerUnreachable, Finding, Job, Node

DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"
SRC = Path(__file__).resolve().parents[1] / "src"


def python_blocks(markdown: str) -> list[str]:
    """The bodies of the fenced ```python blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.M | re.S)


@pytest.mark.process
def test_import_loads_nothing_heavy() -> None:
    code = (
        "import sys, gpufleet\n"
        "heavy = ('httpx', 'numpy', 'pynvml', 'pydantic', 'sqlalchemy', 'gpufleet.')\n"
        "print([m for m in sys.modules if m.startswith(heavy)])\n"
        "gpufleet.Client\n"
        "print('httpx' in sys.modules, 'gpufleet.devices.sim' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    loaded, after = out.stdout.splitlines()
    assert loaded == "[]"
    assert after == "True False"  # the client brings httpx, not the simulator


def test_every_export_resolves_and_is_documented() -> None:
    names = [n for n in gpufleet.__all__ if n != "__version__"]
    assert sorted(names) == sorted(gpufleet._EXPORTS)
    for name in names:
        obj = getattr(gpufleet, name)
        assert (obj.__doc__ or "").strip(), f"gpufleet.{name} has no docstring"
    assert set(names) <= set(dir(gpufleet))
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = gpufleet.no_such_name


def test_documented_in_python_api_md() -> None:
    text = DOC.read_text(encoding="utf-8")
    functions = [n for n in gpufleet.__all__ if n[0].islower() and n != "__version__"]
    missing = [n for n in functions if f"`{n}(" not in text]
    assert not missing, f"docs/python-api.md does not describe {missing}"


@pytest.mark.parametrize(
    ("record", "schema"),
    [
        (Node, "gpufleet.wire.views:NodeOut"),
        (Finding, "gpufleet.wire.views:FindingOut"),
        (Job, "gpufleet.wire.views:JobOut"),
    ],
)
def test_client_reads_the_models_the_server_answers_with(record: type, schema: str) -> None:
    import importlib

    module, _, cls = schema.partition(":")
    assert getattr(importlib.import_module(module), cls) is record  # one definition, no drift


def test_client_refuses_bad_arguments_naming_them() -> None:
    with pytest.raises(gpufleet.UsageError, match="controller URL"):
        Client("ctl:8080", "gf_x")
    with pytest.raises(gpufleet.UsageError, match="token"):
        Client("http://127.0.0.1:1", "")
    with Client("http://127.0.0.1:1", "gf_x", timeout_s=2) as ctl:
        with pytest.raises(gpufleet.UsageError, match="reboot"):
            ctl.node_action("n1", "reboot")
        with pytest.raises(ControllerUnreachable, match=r"127\.0\.0\.1:1"):
            ctl.nodes()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A real `gpufleet up` on a simulated 2-node fleet: (url, admin token)."""
    data = tmp_path_factory.mktemp("up")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(SRC), "HOME": str(data)}
    cmd = [sys.executable, "-m", "gpufleet", "up", "--sim", "2x8xh100-sxm", "--json"]
    cmd += ["--port", str(port), "--data-dir", str(data / "d")]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    text = ""
    info = None
    deadline = time.monotonic() + 90
    while info is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        text += line
        start = text.find("{")
        if start >= 0:
            try:
                info = json.loads(text[start:])
            except ValueError:
                continue
    try:
        assert info is not None, text
        url, token = str(info["url"]), str(info["admin_token"])
        headers = {"Authorization": f"Bearer {token}"}
        while time.monotonic() < deadline:
            doc = httpx.get(f"{url}/api/v1/nodes?gpus=false", headers=headers, timeout=5).json()
            if doc["total"] == 2:
                break
            time.sleep(0.3)
        yield url, token
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.process
def test_docs_examples_run(controller: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    url, token = controller
    monkeypatch.setenv("GPUFLEET_URL", url)
    monkeypatch.setenv("GPUFLEET_TOKEN", token)
    blocks = python_blocks(DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 6, "docs/python-api.md lost its examples"
    namespace: dict[str, object] = {"__name__": "python_api_docs"}
    for i, block in enumerate(blocks, 1):
        try:
            exec(compile(block, f"docs/python-api.md block {i}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"docs/python-api.md block {i} failed:\n{block}") from exc


def test_python_blocks_finds_each_block() -> None:
    md = "text\n```python\na = 1\n```\n```\nnot python\n```\n```python\nb = 2\n```\n"
    assert python_blocks(md) == ["a = 1\n", "b = 2\n"]


@pytest.mark.process
def test_up_gives_simulated_nodes_racks_through_the_client(controller: tuple[str, str]) -> None:
    """`gpufleet up` labels simulated nodes with racks (r00, ...) using `Client.set_node`."""
    url, token = controller
    with Client(url, token) as ctl:
        deadline = time.monotonic() + 30
        racks = [n.rack for n in ctl.nodes()]
        while racks != ["r00", "r00"] and time.monotonic() < deadline:
            time.sleep(0.3)
            racks = [n.rack for n in ctl.nodes()]
    assert racks == ["r00", "r00"]


def test_client_keeps_names_inside_their_path_segment() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path.decode())
        return httpx.Response(200, json={"text": ""})

    with Client("http://ctl:8080", "gf_x", transport=httpx.MockTransport(answer)) as ctl:
        # the mock's {"text": ""} is no NodeDetail: a clear error naming the call, not a dict
        with pytest.raises(gpufleet.MalformedAnswer, match=r"GET /nodes/.*not a NodeDetail"):
            ctl.node("a/../../tokens?x=1")
        ctl.logs("../tokens")
        with pytest.raises(gpufleet.UsageError, match="not a node name"):
            ctl.node("..")
    assert seen == [
        "/api/v1/nodes/a%2F..%2F..%2Ftokens%3Fx%3D1",
        "/api/v1/jobs/..%2Ftokens/logs?tail=0",
    ]


def test_an_http_error_from_the_controller_exits_2() -> None:
    from gpufleet.client import ApiError

    assert ApiError("GET", "/x", 404, "no").exit_code == 2


def test_every_client_call_answers_with_a_model() -> None:
    """Typed answers (issue 26): every call of `Client` but the raw ``request`` returns one of
    the API's models from `gpufleet.wire.views` (or a list of them; ``logs``: the text)."""
    import inspect
    import typing

    from pydantic import BaseModel

    from gpufleet.wire import views

    skip = {"request", "close", "url"}
    calls = [
        n
        for n, f in inspect.getmembers(Client, inspect.isfunction)
        if not n.startswith("_") and n not in skip
    ]
    assert {"job", "node", "summary", "whoami", "health", "energy", "nodes"} <= set(calls)
    for name in calls:
        ret = typing.get_type_hints(getattr(Client, name))["return"]
        if name == "logs":
            assert ret is str
            continue
        inner = typing.get_args(ret)[0] if typing.get_origin(ret) is list else ret
        assert isinstance(inner, type) and issubclass(inner, BaseModel), (name, ret)
        assert getattr(views, inner.__name__) is inner, (name, inner)  # one definition

"""TLS end to end with a self-signed certificate made by the `openssl` command: the controller
and `gpufleet up` serve HTTPS with ``--tls-cert/--tls-key``; an agent pushes to it verifying
with ``--ca`` and serves its own ``/metrics`` over HTTPS; a client without the CA is refused;
a certificate and key that do not belong together are one clear line, exit 2."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gpufleet.client import Client
from gpufleet.testing.testbed import free_port, wait_for
from tests.integration.processes import cli, env_for, start, stop

pytestmark = [pytest.mark.slow, pytest.mark.process]


def make_cert(tmp: Path, name: str, san: str) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make a test certificate")
    cert, key = tmp / f"{name}.pem", tmp / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            f"/CN={name}",
            "-addext",
            f"subjectAltName={san}",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def serve_tls(cert: Path, key: Path) -> list[str]:
    return ["--tls-cert", str(cert), "--tls-key", str(key)]


def test_controller_and_agent_over_tls(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path, "ctl", "IP:127.0.0.1,DNS:localhost")
    data = tmp_path / "data"
    agent_token = cli(["token", "create", "--role", "agent", "--data-dir", str(data)], tmp_path)
    admin = cli(["token", "create", "--role", "admin", "--data-dir", str(data)], tmp_path)
    ctl, info = start(
        [
            "controller",
            "--data-dir",
            str(data),
            "--port",
            str(free_port()),
            "--scheduler",
            "none",
            *serve_tls(cert, key),
            "--json",
        ],
        tmp_path,
    )
    agent = None
    try:
        url = info["url"]
        assert url.startswith("https://")
        with pytest.raises(httpx.ConnectError):  # the system trust store does not know it
            httpx.get(f"{url}/api/v1/health", timeout=5)
        with pytest.raises(httpx.HTTPError):  # no plain HTTP on the TLS port
            httpx.get(url.replace("https://", "http://") + "/api/v1/health", timeout=5)
        metrics = f"127.0.0.1:{free_port()}"
        agent, _ = start(
            [
                "agent",
                "--sim",
                "1x2xh100-sxm",
                "--controller",
                url,
                "--token",
                agent_token["token"],
                "--ca",
                str(cert),
                "--state-dir",
                str(tmp_path / "agent"),
                "--listen",
                metrics,
                *serve_tls(cert, key),
                "--push-interval",
                "0.5",
                "--json",
            ],
            tmp_path,
        )
        with Client(url, admin["token"], ca=cert, timeout_s=5) as client:
            nodes = wait_for(lambda: client.nodes(), 30, "the agent's node registered over TLS")
        assert len(nodes) == 1
        r = httpx.get(f"https://{metrics}/metrics", verify=str(cert), timeout=5)
        assert r.status_code == 200 and "DCGM_FI_DEV_GPU_UTIL" in r.text
        # the jobs CLI verifies with --ca too: with it the controller answers (this one runs no
        # scheduler: 501), without it the certificate is refused before any request
        token_file = tmp_path / "admin.token"
        token_file.write_text(admin["token"] + "\n", encoding="utf-8")
        jobs = [sys.executable, "-m", "gpufleet", "jobs", "list", "--controller", url]
        jobs += ["--token-file", str(token_file)]
        env = {k: v for k, v in env_for(tmp_path).items() if k != "GPUFLEET_CA"}
        with_ca = subprocess.run(
            [*jobs, "--ca", str(cert)], capture_output=True, text=True, env=env, timeout=60
        )
        without = subprocess.run(jobs, capture_output=True, text=True, env=env, timeout=60)
        assert with_ca.returncode == 2 and "501" in with_ca.stderr + with_ca.stdout, with_ca
        assert "certificate" not in (with_ca.stderr + with_ca.stdout).lower()
        assert without.returncode != 0 and "certificate verify failed" in without.stderr, without
    finally:
        if agent is not None:
            stop(agent, signal.SIGTERM)
        stop(ctl, signal.SIGTERM)


def test_up_over_tls_with_a_certificate_for_another_name(tmp_path: Path) -> None:
    # the certificate names the machine's public name only: `up`'s own agents, on loopback,
    # trust exactly this certificate rather than matching its name
    cert, key = make_cert(tmp_path, "up", "DNS:gpufleet.example")
    proc, info = start(
        [
            "up",
            "--sim",
            "2x1xh100-sxm",
            "--data-dir",
            str(tmp_path / "data"),
            "--port",
            str(free_port()),
            *serve_tls(cert, key),
            "--json",
        ],
        tmp_path,
    )
    try:
        assert info["url"].startswith("https://")
        # a client verifying the name properly is refused for 127.0.0.1 ...
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{info['url']}/api/v1/health", verify=str(cert), timeout=5)
        # ... so read the API the way `up`'s agents reach it: the exact certificate pinned
        from gpufleet.tls import pinned_verify

        headers = {"Authorization": f"Bearer {info['admin_token']}"}
        with httpx.Client(verify=pinned_verify(cert), headers=headers, timeout=5) as c:
            wait_for(
                lambda: len(c.get(f"{info['url']}/api/v1/nodes").json()["nodes"]) == 2,
                60,
                "both of up's agents pushed over TLS",
            )
    finally:
        stop(proc, signal.SIGTERM)


def test_a_mismatched_certificate_and_key_is_one_line(tmp_path: Path) -> None:
    cert, _ = make_cert(tmp_path, "a", "DNS:a")
    _, other_key = make_cert(tmp_path, "b", "DNS:b")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "controller",
            "--data-dir",
            str(tmp_path / "d"),
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(other_key),
        ],
        capture_output=True,
        text=True,
        env=env_for(tmp_path),
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "--tls-cert" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2, out.stderr

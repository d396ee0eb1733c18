"""TLS for gpufleet's listeners and clients.

Servers (`gpufleet controller`, `gpufleet up`, the agent's ``/metrics`` listener) take a PEM
certificate chain and key (``--tls-cert``/``--tls-key``); clients (agents, the CLI, the Python
client) verify an ``https://`` server against the system's trust store, or against ``--ca`` (a
PEM bundle, e.g. a private CA's certificate). Verification is never switched off by gpufleet.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import UsageError


@dataclass(frozen=True)
class TlsFiles:
    """A server's certificate chain and private key (PEM), checked to load together."""

    cert: Path
    key: Path

    @classmethod
    def from_options(cls, cert: Path | None, key: Path | None) -> TlsFiles | None:
        """None when neither is given; a usage error naming the option when one is missing or
        the pair does not load."""
        if cert is None and key is None:
            return None
        if cert is None or key is None:
            raise UsageError("--tls-cert and --tls-key go together: give both or neither")
        files = cls(cert, key)
        files.server_context()  # refuse a bad pair now, with a clear line, not in uvicorn
        return files

    def server_context(self) -> ssl.SSLContext:
        """A TLS server context (TLS 1.2 or newer) holding this certificate and key."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        for option, path in (("--tls-cert", self.cert), ("--tls-key", self.key)):
            if not path.is_file():
                raise UsageError(f"{option} {path}: no such file")
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, OSError) as exc:
            raise UsageError(
                f"--tls-cert {self.cert} / --tls-key {self.key}: cannot load them ({exc})"
            ) from exc
        return ctx


def client_verify(ca: Path | None, option: str = "--ca") -> ssl.SSLContext | bool:
    """What to give httpx as ``verify``: the system trust store (True) or a context trusting
    ``ca`` (a PEM file or a directory of them); errors name ``option``."""
    if ca is None:
        return True
    if not ca.exists():
        raise UsageError(f"{option} {ca}: no such file or directory")
    try:
        if ca.is_dir():
            return ssl.create_default_context(capath=str(ca))
        return ssl.create_default_context(cafile=str(ca))
    except (ssl.SSLError, OSError) as exc:
        raise UsageError(f"{option} {ca}: not a PEM certificate bundle ({exc})") from exc


def pinned_verify(cert: Path) -> ssl.SSLContext:
    """A client context that trusts exactly ``cert`` (the server's own certificate) whatever
    name it carries: what `gpufleet up`'s in-process agents use to reach their own listener on
    loopback, where the certificate's names (the machine's public ones) do not match."""
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
    except (ssl.SSLError, OSError) as exc:
        raise UsageError(f"--tls-cert {cert}: not a PEM certificate ({exc})") from exc
    ctx.check_hostname = False  # the exact certificate is pinned instead
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # a leaf issued by a CA is trusted too
    return ctx

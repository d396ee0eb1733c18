"""The control plane's replicas as users give them: ``--controller URL1,URL2`` (or one DNS name
that resolves to several addresses, which the HTTP client already tries in turn).

Agents and the CLI send each request to the replica that answered last and move to the next one
when a replica cannot be reached or answers 502/503/504 (a proxy or a replica starting or
stopping); any replica accepts any request, since all of them share one database
(docs/control-plane.md).
"""

from __future__ import annotations

from gpufleet.errors import UsageError

# answers that mean "this replica cannot serve now", not "the request is wrong"
UNAVAILABLE = frozenset({502, 503, 504})


def controller_urls(value: str, option: str = "--controller") -> list[str]:
    """``URL1,URL2`` as a list of base URLs (no trailing slash); a clear error naming the bad
    one."""
    urls = [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
    if not urls:
        raise UsageError(f"{option} {value!r}: expected a URL like https://HOST:PORT")
    for u in urls:
        host = u.split("://", 1)[1] if "://" in u else ""
        if not u.startswith(("http://", "https://")) or not host.strip("/"):
            raise UsageError(f"{option} {u!r}: expected http://HOST:PORT or https://HOST:PORT")
    if len(set(urls)) != len(urls):
        raise UsageError(f"{option} {value!r}: a URL is given twice")
    return urls


class Replicas:
    """The replica URLs and which one answered last (requests start there)."""

    def __init__(self, value: str, option: str = "--controller") -> None:
        self.urls = controller_urls(value, option)
        self.active = 0
        self.failovers = 0

    @property
    def base(self) -> str:
        """The URL requests go to first."""
        return self.urls[self.active]

    def order(self) -> list[int]:
        """Indexes to try, the active one first, then the others in the order given."""
        n = len(self.urls)
        return [(self.active + i) % n for i in range(n)]

    def answered(self, index: int) -> None:
        """Replica ``index`` answered: later requests start there."""
        if index != self.active:
            self.active = index
            self.failovers += 1

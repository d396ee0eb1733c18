"""A token's default name carries none of the token (issue 29: it embedded 6 characters of
the secret, and names are listed, audited and logged)."""

from __future__ import annotations

from collections.abc import Callable

from gpufleet.control.service import ControlService


def test_default_token_names_hold_no_part_of_the_token(
    make_service: Callable[..., ControlService],
) -> None:
    svc = make_service()
    for role in ("agent", "viewer", "operator", "admin") * 5:
        token, row = svc.store.tokens.create(role)
        assert row.name.startswith(f"{role}-"), row.name
        suffix = row.name.removeprefix(f"{role}-")
        # before: the token's own characters 3-9 (a random 6 hex digits appear in a token by
        # chance about once in 10^9)
        assert len(suffix) == 6 and suffix not in token, (row.name, token)
    token, row = svc.store.tokens.create("viewer", name="grafana")
    assert row.name == "grafana"

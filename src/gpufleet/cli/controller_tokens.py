"""`gpufleet token create|list|revoke`: API tokens, stored hashed, shown once."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpufleet.cli.common import JsonOption
from gpufleet.cli.output import console, emit_json, err_console
from gpufleet.errors import UsageError

if TYPE_CHECKING:
    pass

from gpufleet.cli.controller_common import DataDirOption, DbUrlOption, _local_admin, _open_store


def register_tokens(tok: typer.Typer) -> None:
    """Attach `token create`, `token list` and `token revoke`."""

    @tok.command("create")
    def token_create(
        role: str | None = typer.Option(
            None, "--role", help="admin, operator, viewer or agent (agent with --node)."
        ),
        name: str = typer.Option("", "--name", help="A label shown in lists."),
        tenant: str | None = typer.Option(None, "--tenant", help="Bind to a tenant."),
        node: str | None = typer.Option(
            None, "--node", help="Agent token for one node (implies --role agent)."
        ),
        out: Path | None = typer.Option(
            None,
            "--out",
            help="Write the token to this file (mode 0600) instead of printing it; give the "
            "file to --token-file.",
            metavar="FILE",
        ),
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Create a token and print it once (only its hash is stored), or write it to --out."""
        from gpufleet.control.fleet import actions
        from gpufleet.control.up import write_secret

        if node is not None and role not in (None, "agent"):
            raise UsageError("--node makes an agent token: use --role agent with it")
        if role is None:
            if node is None:
                raise UsageError("token create needs --role (admin, operator, viewer or agent)")
            role = "agent"
        store = _open_store(data_dir, db_url)
        token, tid = actions.create_token(store, _local_admin(), role, name, tenant, node)
        store.engine.dispose()
        if out is not None:
            try:
                write_secret(out.expanduser(), token)
            except OSError as exc:
                raise UsageError(f"--out {out}: {exc.strerror}") from exc
            token = f"written to {out}"
        if json_out:
            emit_json({"id": tid, "role": role, "tenant": tenant, "node": node, "token": token})
        elif out is not None:
            console.print(f"token {tid} ({role}) {token} (mode 0600)", highlight=False)
        else:
            console.print(f"token {tid} ({role}): [bold]{token}[/]", highlight=False)
            err_console.print("Store it now: it is not shown again.")

    @tok.command("list")
    def token_list(
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        json_out: bool = JsonOption,
    ) -> None:
        """List tokens (prefix, role, tenant, node; never the token)."""
        from rich.table import Table

        store = _open_store(data_dir, db_url)
        rows = store.tokens.list()
        store.engine.dispose()
        data = [
            {
                "id": r.id,
                "name": r.name,
                "prefix": r.prefix,
                "role": r.role,
                "tenant": r.tenant,
                "node": r.node,
                "owner": r.owner,
                "created_s": r.created_s,
                "revoked_s": r.revoked_s,
            }
            for r in rows
        ]
        if json_out:
            emit_json(data)
            return
        table = Table("id", "name", "prefix", "role", "tenant", "node", "revoked")
        for d in data:
            table.add_row(
                str(d["id"]),
                str(d["name"]),
                f"{d['prefix']}…",
                str(d["role"]),
                str(d["tenant"] or ""),
                str(d["node"] or ""),
                "yes" if d["revoked_s"] else "",
            )
        console.print(table)

    @tok.command("revoke")
    def token_revoke(
        token_id: int = typer.Argument(..., help="Token id (see `gpufleet token list`)."),
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Revoke a token (every running controller refuses it within a second)."""
        from gpufleet.control.fleet import actions
        from gpufleet.control.state.store import NotFound

        store = _open_store(data_dir, db_url)
        try:
            actions.revoke_token(store, _local_admin(), token_id)
        except NotFound as exc:
            raise UsageError(str(exc)) from exc
        finally:
            store.engine.dispose()
        if json_out:
            emit_json({"id": token_id, "revoked": True})
        else:
            console.print(f"token {token_id} revoked")

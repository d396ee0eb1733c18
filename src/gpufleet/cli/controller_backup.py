"""`gpufleet controller backup|restore`: the database and key files to one file and back
(docs/control-plane.md, "Backup and restore")."""

from __future__ import annotations

from pathlib import Path

import typer

from gpufleet.cli.common import JsonOption
from gpufleet.cli.controller_common import DataDirOption, DbUrlOption, _data_dir, _db_url
from gpufleet.cli.output import console, emit_json
from gpufleet.errors import UsageError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(text: str) -> int:
    """``--max-size``: bytes, or a number with K, M, G or T (binary: 1M is 1,048,576)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS else ""
    try:
        value = float(t[: len(t) - len(unit)]) * _UNITS[unit]
    except ValueError:
        value = -1
    if not 0 < value < 1 << 60:
        raise UsageError(f"--max-size {text}: expected a size such as 1048576, 512M or 2G")
    return int(value)


def register_backup(ctl: typer.Typer) -> None:
    """Attach `controller backup` and `controller restore`."""

    def _url_and_dir(
        ctx: typer.Context, data_dir: Path | None, db_url: str | None
    ) -> tuple[str, Path | None]:
        from gpufleet.control.db.engine import database_url

        parent = ctx.parent.obj if ctx.parent and ctx.parent.obj else {}
        url_opt = _db_url(db_url or parent.get("db_url"))
        ddir = _data_dir(data_dir or parent.get("data_dir"))
        return database_url(None if url_opt else ddir, url_opt), ddir

    @ctl.command("backup")
    def backup_cmd(
        ctx: typer.Context,
        to: Path = typer.Option(
            ..., "--to", help="The backup file to write (0600).", metavar="FILE"
        ),
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Back up the database and key files, safely while the controller runs."""
        from gpufleet.control.db.backup import backup
        from gpufleet.control.db.engine import current_revision, make_engine

        url, ddir = _url_and_dir(ctx, data_dir, db_url)
        engine = make_engine(url)
        try:
            rev = current_revision(engine)
        finally:
            engine.dispose()
        info = backup(url, ddir, to, rev)
        if json_out:
            emit_json(info.__dict__)
        else:
            console.print(
                f"backed up {info.database} database (revision {info.revision}) and "
                f"{len(info.members) - 1} key file(s) to {info.path} ({info.bytes:,} bytes)",
                highlight=False,
            )

    @ctl.command("restore")
    def restore_cmd(
        ctx: typer.Context,
        source: Path = typer.Argument(
            ..., help="A file written by `controller backup`.", metavar="FILE"
        ),
        force: bool = typer.Option(False, "--force", help="Replace a database that holds nodes."),
        max_size: str | None = typer.Option(
            None,
            "--max-size",
            help="The most bytes one member may hold (512M, 2G; default: the archive's size, "
            "or 100 times it and at least 16M for a compressed one).",
            metavar="SIZE",
        ),
        data_dir: Path | None = DataDirOption,
        db_url: str | None = DbUrlOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Restore a backup (the controller must be stopped), then migrate to this version."""
        from gpufleet.control.db.backup import restore
        from gpufleet.control.db.engine import make_engine, migrate

        url, ddir = _url_and_dir(ctx, data_dir, db_url)
        bound = None if max_size is None else _size(max_size)
        manifest = restore(source, url, ddir, force=force, max_size=bound)
        engine = make_engine(url)
        try:
            rev = migrate(engine)
        finally:
            engine.dispose()
        if json_out:
            emit_json(
                {
                    "restored": str(source),
                    "from_revision": manifest.get("revision"),
                    "revision": rev,
                    "created_s": manifest.get("created_s"),
                }
            )
        else:
            console.print(
                f"restored {source} (taken at revision {manifest.get('revision')}); database now "
                f"at revision {rev}",
                highlight=False,
            )

"""The previous release as real processes, without git: its ``src/gpufleet``, shipped as
``tests/fixtures/upgrade/<ref>/gpufleet-src.tar.gz`` (scripts/make-upgrade-src-fixture.sh),
checked against the manifest's sha256, unpacked once, and run with this venv's interpreter and
``PYTHONPATH=<unpacked>/src`` (the old release's dependencies are this venv's). A path on
``PYTHONPATH`` goes before site-packages, so an editable or installed current gpufleet does
not shadow it; `Previous.create_tokens` proves it: the child that makes the old database's
tokens says where it imported gpufleet from."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).parent.parent / "fixtures" / "upgrade"

# run by the previous release: where it imports gpufleet from, its schema head, and tokens made
# by its own rig (`gpufleet.testing.procs.create_tokens`, which migrates a new database first)
_TOKENS = """
import json, sys
import gpufleet, gpufleet.agent.runner, gpufleet.control.service
from gpufleet.control.db.engine import SCHEMA_HEAD
from gpufleet.testing.procs import create_tokens
mods = [gpufleet, gpufleet.agent.runner, gpufleet.control.service]
wanted = {k: tuple(v) for k, v in json.loads(sys.argv[2]).items()}
tokens = create_tokens(None, wanted, db_url=sys.argv[1])
print(json.dumps({"files": [m.__file__ for m in mods], "head": SCHEMA_HEAD, "tokens": tokens}))
"""


@dataclass(frozen=True)
class Previous:
    """One unpacked previous release: ``src`` holds its ``gpufleet`` package."""

    ref: str
    commit: str
    src: Path
    schema_head: str  # its migrations' head, from the fixture's manifest

    def env(self) -> dict[str, str]:
        """What a child needs on top of the tests' environment to run this release."""
        return {"PYTHONPATH": str(self.src)}

    def create_tokens(
        self, db_url: str, wanted: dict[str, tuple[str, str | None]]
    ) -> dict[str, str]:
        """``{label: (role, node)}`` to ``{label: token}``, made by the previous release's own
        code in a child with `env` (one child: a Python start costs seconds on a loaded
        machine), which migrates a new database to the OLD head. Fails unless that child
        imported gpufleet (its agent and control plane too) from ``src`` and knew the old
        schema head, not this tree's."""
        out = subprocess.run(
            [sys.executable, "-c", _TOKENS, db_url, json.dumps(wanted)],
            capture_output=True,
            text=True,
            env={**os.environ, **self.env()},
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        doc = json.loads(out.stdout)
        root = self.src.resolve()
        for f in doc["files"]:
            assert Path(f).resolve().is_relative_to(root), f"{f} is not the previous release's"
        assert doc["head"] == self.schema_head, doc
        tokens: dict[str, str] = doc["tokens"]
        return tokens


def unpack(ref: str, into: Path) -> Previous:
    """The fixture's source archive of ``ref``, its sha256 checked, unpacked under ``into``."""
    fixture = FIXTURES / ref
    manifest = json.loads((fixture / "manifest.json").read_text(encoding="utf-8"))
    source = manifest["source"]
    archive = fixture / source["archive"]
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert digest == source["sha256"], f"{archive}: sha256 {digest}, manifest {source['sha256']}"
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(into, filter="data")
    src = into / "src"
    assert (src / "gpufleet" / "__init__.py").is_file(), f"{archive}: no src/gpufleet"
    return Previous(ref, source["commit"], src, manifest["schema_revision"])

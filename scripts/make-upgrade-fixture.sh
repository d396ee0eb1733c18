#!/usr/bin/env bash
# Fixtures from a previous release for tests/upgrade/ (docs/control-plane.md, "Upgrading
# gpufleet"): check out REF (default 109ee82) in a temporary git worktree, run THAT code (its
# CLI and its own gpufleet.testing.procs, PYTHONPATH=<worktree>/src, this venv's interpreter)
# to fill a data directory (a migrated SQLite database, an admin token and an agent token bound
# to node-a, a controller with one simulated agent: nodes, GPUs, findings, events, audit, one
# embedded-scheduler job), capture the old agent's raw batch bodies through a small forwarding
# server, and write the old controller's own API answers to manifest.json. Then the worktree is
# removed; last, scripts/make-upgrade-src-fixture.sh archives that release's src/gpufleet beside
# it. Output: tests/fixtures/upgrade/<REF>/ (replaced). Usage:
#   scripts/make-upgrade-fixture.sh [REF]
set -euo pipefail

REF="${1:-109ee82}"
ROOT="$(git rev-parse --show-toplevel)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
COMMIT="$(git -C "$ROOT" rev-parse --verify "$REF^{commit}")"
OUT="$ROOT/tests/fixtures/upgrade/$REF"
WORK="$(mktemp -d /tmp/gpufleet-upgrade-fixture.XXXXXX)"
WT="$WORK/tree"

cleanup() {
    git -C "$ROOT" worktree remove --force "$WT" 2>/dev/null || true
    if [ -n "${FIXTURE_KEEP:-}" ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

git -C "$ROOT" worktree add --detach --quiet "$WT" "$COMMIT"
rm -rf "$OUT"
mkdir -p "$OUT"

# From here on only the old release's code is importable as gpufleet.
export PYTHONPATH="$WT/src"
unset GPUFLEET_DATA_DIR GPUFLEET_DB_URL GPUFLEET_AGENT_TOKEN
"$PY" -m gpufleet controller migrate --data-dir "$OUT/data" --json >"$WORK/migrate.json"

FIXTURE_OUT="$OUT" FIXTURE_WORK="$WORK" FIXTURE_REF="$REF" FIXTURE_COMMIT="$COMMIT" \
    FIXTURE_MIGRATE="$WORK/migrate.json" "$PY" - <<'PYEOF'
import gzip
import json
import os
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

import gpufleet
from gpufleet.control.db.engine import SCHEMA_HEAD
from gpufleet.testing.procs import AgentProcess, ControllerProcess, create_tokens
from gpufleet.testing.testbed import wait_for

out, work = Path(os.environ["FIXTURE_OUT"]), Path(os.environ["FIXTURE_WORK"])
assert str(Path(gpufleet.__file__).resolve()).startswith(str(work)), gpufleet.__file__
data, node = out / "data", "node-a"
tokens = create_tokens(data, {"admin": ("admin", None), "agent": ("agent", node)})
ctl = ControllerProcess(data, tokens["admin"]).start()

held: dict[int, bytes] = {}  # seq -> body: answered 503, never reached the old controller
forwarded: dict[int, bytes] = {}
hold = threading.Event()


class Capture(BaseHTTPRequestHandler):
    """Forwards the agent's requests to the old controller, keeping each ingest body."""

    def log_message(self, *args: object) -> None:
        pass

    def _forward(self, method: str) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/api/v1/ingest":
            body = gzip.decompress(raw) if self.headers.get("Content-Encoding") == "gzip" else raw
            seq = json.loads(body)["seq"]
            if hold.is_set():
                held.setdefault(seq, body)
                self.send_response(503)
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            forwarded.setdefault(seq, body)
        skip = {"host", "content-length", "connection", "accept-encoding"}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
        r = httpx.request(method, ctl.url + self.path, content=raw, headers=headers, timeout=30)
        self.send_response(r.status_code)
        for k, v in r.headers.items():
            if k.lower() not in ("content-length", "content-encoding", "transfer-encoding"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(r.content)))
        self.end_headers()
        self.wfile.write(r.content)

    def do_GET(self) -> None:
        self._forward("GET")

    def do_POST(self) -> None:
        self._forward("POST")


server = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
threading.Thread(target=server.serve_forever, daemon=True).start()
faults = [
    {"kind": "xid", "gpu": 0, "at_s": 3.0, "xid": 13},
]
agent = AgentProcess(
    node, f"http://127.0.0.1:{server.server_port}", tokens["agent"], work / "agent", faults=faults
).start()
try:
    ctl.wait_in_service(node, 30)
    job = ctl.submit("upgrade-fixture", ["true"])
    ctl.wait_ended(job)

    def findings() -> list:
        doc = ctl.call("GET", "/api/v1/findings").json()
        items = doc["findings"] if isinstance(doc, dict) else doc
        return items or None

    wait_for(findings, 60, "a finding from the old agent", step_s=0.2)
    r = ctl.call("POST", f"/api/v1/nodes/{node}/actions/drain", json={"reason": "fixture"})
    assert r.status_code < 300, r.text
    wait_for(lambda: ctl.node_state(node) in ("drained", "draining"), 60, "drained", step_s=0.2)
    r = ctl.call("POST", f"/api/v1/nodes/{node}/actions/resume", json={"reason": "fixture"})
    assert r.status_code < 300, r.text
    last = max(forwarded)
    wait_for(lambda: max(forwarded) >= last + 2, 60, "two more batches", step_s=0.1)
    answers = {
        path: ctl.call("GET", path).json()
        for path in (
            "/api/v1/nodes",
            f"/api/v1/nodes/{node}",
            "/api/v1/findings",
            "/api/v1/events",
            "/api/v1/audit",
            f"/api/v1/jobs/{job}",
        )
    }
    hold.set()  # from now on batches are kept and refused: the old controller never stores them
    wait_for(lambda: held, 60, "a held batch", step_s=0.1)
finally:
    agent.stop()
    ctl.stop()
    server.shutdown()

batches = out / "batches"
batches.mkdir()
seqs = sorted(forwarded)
picked = {
    "first": seqs[0],  # carries the devices
    "stored": seqs[-1],
}
for name, seq in picked.items():
    (batches / f"{name}-seq{seq}.json").write_bytes(forwarded[seq])
held_seq = min(held)
(batches / f"unstored-seq{held_seq}.json").write_bytes(held[held_seq])
for p in [*data.glob("*.log"), data / "controller.lock", data / "policy.yaml"]:
    p.unlink(missing_ok=True)
for side in ("-wal", "-shm"):
    assert not (data / f"gpufleet.db{side}").exists(), f"gpufleet.db{side} left behind"
migrated = json.loads(Path(os.environ["FIXTURE_MIGRATE"]).read_text())
manifest = {
    "ref": os.environ["FIXTURE_REF"],
    "commit": os.environ["FIXTURE_COMMIT"],
    "command": f"scripts/make-upgrade-fixture.sh {os.environ['FIXTURE_REF']}",
    "generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "schema_revision": SCHEMA_HEAD,
    "migrate": migrated,
    "node": node,
    "job": job,
    "tokens": tokens,  # test-only tokens of this fixture's database (README.md)
    "batches": {
        "stored": [f"first-seq{picked['first']}.json", f"stored-seq{picked['stored']}.json"],
        "unstored": [f"unstored-seq{held_seq}.json"],
    },
    "answers": answers,  # the old controller's own API answers
}
(out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
print(f"fixture from {manifest['commit']} (revision {SCHEMA_HEAD}) in {out}")
PYEOF

cat >"$OUT/README.md" <<EOF
# Upgrade fixture from gpufleet $REF

Written by \`scripts/make-upgrade-fixture.sh $REF\` (commit $COMMIT): that release's own code
created \`data/\` (an SQLite database at its schema head, the embedded scheduler's sealing key)
with its CLI and its \`gpufleet.testing.procs\`, ran a controller with one simulated agent
(node-a, 2 GPUs, an injected XID 13, one job, a drain and a resume), and captured the agent's
raw batch bodies under \`batches/\` (\`unstored-*\` were held back and never reached that
controller). \`manifest.json\` names the commit, the command and the old controller's own API
answers, which \`tests/upgrade/test_upgrade_*.py\` compare with what this release answers.

The tokens in \`manifest.json\` and the database, and the sealing key, are **test-only**: they
protect nothing but this fixture. Regenerate with the command above; the tests need neither git
nor the worktree.
EOF
# the release's own source, for the tests that run its controller and agent (rolling upgrade)
"$ROOT/scripts/make-upgrade-src-fixture.sh" "$REF"
du -sh "$OUT"

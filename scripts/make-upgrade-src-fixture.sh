#!/usr/bin/env bash
# The previous release's own source for tests/upgrade/test_rolling_upgrade.py (docs/
# control-plane.md, "Upgrading gpufleet"): `git archive REF src/gpufleet | gzip -9n` into
# tests/fixtures/upgrade/<REF>/gpufleet-src.tar.gz, so the tests run that release's controller
# and agent (PYTHONPATH=<unpacked>/src, this venv's interpreter) without git. Only the package's
# tracked files go in (Python, the catalog's YAML, the dashboard's static files): no tests, no
# data directory. The archive is byte-for-byte reproducible (git archive's mtimes are the
# commit's; gzip -n stores no name or time); its sha256 and size go into manifest.json
# ("source") and the README. scripts/make-upgrade-fixture.sh calls this after it has written
# the rest of the fixture. Usage:
#   scripts/make-upgrade-src-fixture.sh [REF]
set -euo pipefail

REF="${1:-109ee82}"
ROOT="$(git rev-parse --show-toplevel)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
COMMIT="$(git -C "$ROOT" rev-parse --verify "$REF^{commit}")"
OUT="$ROOT/tests/fixtures/upgrade/$REF"
ARCHIVE="$OUT/gpufleet-src.tar.gz"
MAX_BYTES=$((2 * 1024 * 1024))

[ -f "$OUT/manifest.json" ] || { echo "$OUT/manifest.json: missing (run make-upgrade-fixture.sh $REF)" >&2; exit 1; }

# nothing but the package's own sources: refuse anything that looks like a key or a database
bad="$(git -C "$ROOT" ls-tree -r --name-only "$COMMIT" src/gpufleet \
    | grep -Ei '\.(pem|key|crt|p12|db|sqlite|env)$|(^|/)\.env|id_rsa' || true)"
if [ -n "$bad" ]; then
    echo "refusing to archive these files of $REF:" >&2
    echo "$bad" >&2
    exit 1
fi

tmp="$(mktemp "$OUT/.gpufleet-src.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
git -C "$ROOT" archive --format=tar "$COMMIT" src/gpufleet | gzip -9n >"$tmp"
size="$(stat -c %s "$tmp")"
if [ "$size" -gt "$MAX_BYTES" ]; then
    echo "$ARCHIVE would be $size bytes (over $MAX_BYTES): look at what src/gpufleet holds" >&2
    exit 1
fi
chmod 0644 "$tmp"
mv "$tmp" "$ARCHIVE"
sha="$(sha256sum "$ARCHIVE" | cut -d' ' -f1)"

ARCHIVE_SHA="$sha" ARCHIVE_SIZE="$size" ARCHIVE_COMMIT="$COMMIT" ARCHIVE_REF="$REF" \
    MANIFEST="$OUT/manifest.json" "$PY" - <<'PYEOF'
import json
import os
from pathlib import Path

path = Path(os.environ["MANIFEST"])
manifest = json.loads(path.read_text(encoding="utf-8"))
manifest["source"] = {
    "archive": "gpufleet-src.tar.gz",
    "sha256": os.environ["ARCHIVE_SHA"],
    "bytes": int(os.environ["ARCHIVE_SIZE"]),
    "commit": os.environ["ARCHIVE_COMMIT"],
    "command": f"scripts/make-upgrade-src-fixture.sh {os.environ['ARCHIVE_REF']}",
    "made_with": f"git archive {os.environ['ARCHIVE_COMMIT']} src/gpufleet | gzip -9n",
}
path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
PYEOF

readme="$OUT/README.md"
line="\`gpufleet-src.tar.gz\` is that release's \`src/gpufleet\` (\`git archive $COMMIT src/gpufleet | gzip -9n\`, sha256 $sha, $size bytes; \`scripts/make-upgrade-src-fixture.sh $REF\`): \`tests/upgrade/test_rolling_upgrade.py\` runs its controller and agent."
if [ -f "$readme" ]; then
    grep -v '^`gpufleet-src.tar.gz`' "$readme" >"$readme.new" || true
    printf '\n%s\n' "$line" >>"$readme.new"
    # one blank line before the source line, however often this runs
    "$PY" -c 'import sys,re;p=sys.argv[1];t=open(p).read();open(p,"w").write(re.sub(r"\n{3,}", "\n\n", t))' "$readme.new"
    mv "$readme.new" "$readme"
fi
echo "$ARCHIVE: $size bytes, sha256 $sha"

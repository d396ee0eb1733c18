#!/usr/bin/env bash
# Installs the Debian packages the tests drive for real (none needed yet beyond Python).
# Idempotent: does nothing when everything is present.
set -euo pipefail
need=()
for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

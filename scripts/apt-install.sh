#!/usr/bin/env bash
# Install with apt the Debian packages named as arguments that are not installed yet (sudo when not root).
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "== apt-get install ${missing[*]}"
  $sudo apt-get update -q && $sudo apt-get install -y -q "${missing[@]}"
fi

#!/usr/bin/env bash
# Set up everything on a fresh Debian machine with Python 3.11: system packages (apt), a virtual
# environment in .venv with the pinned Python packages, and tvm-hetero itself (built from source).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pkg in cmake g++ ninja-build libgtest-dev libdnnl-dev g++-aarch64-linux-gnu; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "== apt-get install ${missing[*]}"
  $sudo apt-get update -q && $sudo apt-get install -y -q "${missing[@]}"
fi

python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
[ -x .venv/bin/python ] || "$python" -m venv .venv
echo "== pip install .[test] (builds libtvm_hetero.so)"
.venv/bin/python -m pip install -q --disable-pip-version-check ".[test]"

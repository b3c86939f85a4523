#!/usr/bin/env bash
# Set up everything on a fresh Debian machine with Python 3.11: system packages (apt), a virtual
# environment in .venv with the pinned Python packages, and tvm-hetero itself (built from source).
set -euo pipefail
cd "$(dirname "$0")/.."

# libdnnl-dev: oneDNN 2.6, which the default build needs (CMake stops without it).
scripts/apt-install.sh cmake g++ ninja-build libgtest-dev libdnnl-dev g++-aarch64-linux-gnu

python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
[ -x .venv/bin/python ] || "$python" -m venv .venv
echo "== pip install .[test] (builds libtvm_hetero.so)"
.venv/bin/python -m pip install -q --disable-pip-version-check ".[test]"

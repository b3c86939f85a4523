#!/usr/bin/env bash
# Set up, then run the main job: a real model (Inception-v1) compiled for two devices, run and checked.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/tvm-hetero demo "$@"

#!/usr/bin/env bash
# Set up, then run the main job: Inception-v1 over two CPU clusters by measured cost, then SqueezeNet
# over the host CPU and a Qualcomm HTP (QNN, emulated by onnxruntime-qnn), then a tiny decoder whose
# prompt is prefilled on the HTP and whose tokens are decoded on the CPU, each run and checked.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/tvm-hetero demo "$@"
echo
.venv/bin/tvm-hetero demo-htp

#!/usr/bin/env bash
# The installed wheel against the source build, each against onnxruntime: bench/default_vs_onnxruntime.py
# in alternating processes, one importing the wheel installed in a fresh venv outside the tree, one this
# checkout's build/libtvm_hetero.so. Each process times its side interleaved with onnxruntime, so the
# ratios of the two sides compare even while the machine's load moves. Results: docs/performance.md.
#
#   bench/installed_vs_source.sh [REPEATS [THREADS...]]     # default: 3 repeats, 1 and 2 threads
# On a shared machine export OMP_WAIT_POLICY=PASSIVE first (two threads; docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
threads=("${@:2}")
[ ${#threads[@]} -gt 0 ] || threads=(1 2)
py=${PYTHON:-$PWD/.venv/bin/python}  # the source side: has onnx and onnxruntime ([test] extra)
[ -f build/libtvm_hetero.so ] || { echo "build/libtvm_hetero.so is missing: cmake --build build" >&2; exit 1; }
ls dist/tvm_hetero-*.whl >/dev/null 2>&1 || scripts/wheel.sh

place=$(mktemp -d)
trap 'rm -rf "$place"' EXIT
"$py" -m venv "$place/venv"
"$place/venv/bin/pip" install -q --disable-pip-version-check "$(ls "$PWD"/dist/tvm_hetero-*.whl)[models]"
cp bench/default_vs_onnxruntime.py "$place/"

for rep in $(seq "$repeats"); do
  for t in "${threads[@]}"; do
    sides="source wheel"
    [ $((rep % 2)) = 0 ] && sides="wheel source"  # neither side always first
    for side in $sides; do
      echo "=== rep $rep threads $t side $side start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
      if [ "$side" = source ]; then
        TVM_HETERO_LIBRARY="$PWD/build/libtvm_hetero.so" PYTHONPATH=python "$py" bench/default_vs_onnxruntime.py --threads "$t"
      else
        (cd "$place" && env -u PYTHONPATH -u TVM_HETERO_LIBRARY venv/bin/python default_vs_onnxruntime.py --threads "$t")
      fi
    done
  done
done

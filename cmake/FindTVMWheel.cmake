# Locate the installed apache-tvm and apache-tvm-ffi wheels (headers, libraries) through Python.
# Defines the imported targets tvm_ffi::shared (from tvm-ffi's own CMake config) and tvm::runtime, and
# TVM_WHEEL_VERSION: the apache-tvm release built against (what `tvm-hetero --version` reports).
#
# Cross builds (cmake/aarch64-linux-gnu.cmake) set TVM_WHEEL_ROOT to a folder holding the *target's*
# wheels unpacked (tvm/, tvm_ffi/): the build machine's Python can neither import nor describe them.
if(TVM_WHEEL_ROOT)
  set(TVM_PACKAGE_DIR "${TVM_WHEEL_ROOT}/tvm")
  set(TVM_LIB_DIR "${TVM_PACKAGE_DIR}/lib")
  set(TVM_FFI_LIB_DIR "${TVM_WHEEL_ROOT}/tvm_ffi/lib")
  foreach(_file "${TVM_LIB_DIR}/libtvm_runtime.so" "${TVM_FFI_LIB_DIR}/libtvm_ffi.so" "${TVM_PACKAGE_DIR}/include")
    if(NOT EXISTS "${_file}")
      message(FATAL_ERROR "TVM_WHEEL_ROOT=${TVM_WHEEL_ROOT}: ${_file} is missing (unzip the apache-tvm and apache-tvm-ffi wheels there)")
    endif()
  endforeach()
  add_library(tvm_ffi::shared SHARED IMPORTED)
  set_target_properties(tvm_ffi::shared PROPERTIES
    IMPORTED_LOCATION "${TVM_FFI_LIB_DIR}/libtvm_ffi.so"
    INTERFACE_INCLUDE_DIRECTORIES "${TVM_WHEEL_ROOT}/tvm_ffi/include")
  target_compile_features(tvm_ffi::shared INTERFACE cxx_std_17)
  add_library(tvm::runtime SHARED IMPORTED)
  set_target_properties(tvm::runtime PROPERTIES
    IMPORTED_LOCATION "${TVM_LIB_DIR}/libtvm_runtime.so"
    INTERFACE_INCLUDE_DIRECTORIES "${TVM_PACKAGE_DIR}/include"
    INTERFACE_LINK_LIBRARIES tvm_ffi::shared)
  file(GLOB _tvm_dist_info "${TVM_WHEEL_ROOT}/apache_tvm-*.dist-info")
  string(REGEX MATCH "apache_tvm-([^/]*)\\.dist-info$" _match "${_tvm_dist_info}")
  set(TVM_WHEEL_VERSION "${CMAKE_MATCH_1}")
  message(STATUS "TVM wheel (cross build): ${TVM_WHEEL_ROOT} (apache-tvm ${TVM_WHEEL_VERSION})")
  return()
endif()

find_package(Python3 REQUIRED COMPONENTS Interpreter)

execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c "import tvm_ffi.libinfo as f; print(f.find_cmake_path())"
  OUTPUT_VARIABLE TVM_FFI_CMAKE_DIR OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "apache-tvm-ffi is not importable by ${Python3_EXECUTABLE}; pip install apache-tvm==0.27.0.post1")
endif()
set(Python_EXECUTABLE "${Python3_EXECUTABLE}")
find_package(tvm_ffi CONFIG REQUIRED PATHS "${TVM_FFI_CMAKE_DIR}" NO_DEFAULT_PATH)

# Reads tvm's folder and release without importing tvm (which loads the whole compiler).
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
          "import importlib.util, importlib.metadata as m, os; \
print(os.path.dirname(importlib.util.find_spec('tvm').origin)); print(m.version('apache-tvm'))"
  OUTPUT_VARIABLE _tvm_lines OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
string(REPLACE "\n" ";" _tvm_lines "${_tvm_lines};")
list(GET _tvm_lines 0 TVM_PACKAGE_DIR)
list(GET _tvm_lines 1 TVM_WHEEL_VERSION)
if(NOT _rc EQUAL 0 OR NOT EXISTS "${TVM_PACKAGE_DIR}/lib/libtvm_runtime.so")
  message(FATAL_ERROR "apache-tvm (with lib/libtvm_runtime.so) not found for ${Python3_EXECUTABLE}")
endif()
get_filename_component(TVM_FFI_LIB_DIR "${tvm_ffi_LIB_FILES}" DIRECTORY)
set(TVM_LIB_DIR "${TVM_PACKAGE_DIR}/lib")

add_library(tvm::runtime SHARED IMPORTED)
set_target_properties(tvm::runtime PROPERTIES
  IMPORTED_LOCATION "${TVM_LIB_DIR}/libtvm_runtime.so"
  INTERFACE_INCLUDE_DIRECTORIES "${TVM_PACKAGE_DIR}/include"
  INTERFACE_LINK_LIBRARIES tvm_ffi::shared)
message(STATUS "TVM wheel: apache-tvm ${TVM_WHEEL_VERSION} in ${TVM_PACKAGE_DIR}; tvm-ffi libraries: ${TVM_FFI_LIB_DIR}")

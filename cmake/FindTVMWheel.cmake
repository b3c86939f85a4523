# Locate the installed apache-tvm and apache-tvm-ffi wheels (headers, libraries) through Python.
# Defines the imported targets tvm_ffi::shared (from tvm-ffi's own CMake config) and tvm::runtime.
find_package(Python3 REQUIRED COMPONENTS Interpreter)

execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c "import tvm_ffi.libinfo as f; print(f.find_cmake_path())"
  OUTPUT_VARIABLE TVM_FFI_CMAKE_DIR OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "apache-tvm-ffi is not importable by ${Python3_EXECUTABLE}; pip install apache-tvm==0.27.0.post1")
endif()
set(Python_EXECUTABLE "${Python3_EXECUTABLE}")
find_package(tvm_ffi CONFIG REQUIRED PATHS "${TVM_FFI_CMAKE_DIR}" NO_DEFAULT_PATH)

# Reads tvm's include and lib folders without importing tvm (which loads the whole compiler).
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
          "import importlib.util, os; d = os.path.dirname(importlib.util.find_spec('tvm').origin); print(d)"
  OUTPUT_VARIABLE TVM_PACKAGE_DIR OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
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
message(STATUS "TVM wheel: ${TVM_PACKAGE_DIR}; tvm-ffi libraries: ${TVM_FFI_LIB_DIR}")

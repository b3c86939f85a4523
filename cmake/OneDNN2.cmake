# oneDNN 2.x for the dnnl backend: sets DNNL_INCLUDE_DIR, DNNL_LIBRARY and TVM_HETERO_ONEDNN_VERSION
# ("2.6.3"), or stops the configure with what to install. The backend is written against the 2.x API
# (3.x renamed and removed parts of it), so a 3.x install is refused rather than half-used.
set(_onednn_off_hint "To build without it on purpose (CPU convolutions and matmuls then run as untuned TVM \
kernels, many times slower): cmake -DTVM_HETERO_WITH_ONEDNN=OFF, or for pip: TVM_HETERO_WITH_ONEDNN=OFF pip install .")

find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl_version.h)
find_library(DNNL_LIBRARY NAMES dnnl)
if(NOT DNNL_INCLUDE_DIR OR NOT DNNL_LIBRARY)
  message(FATAL_ERROR "oneDNN 2.x not found (Debian/Ubuntu: apt-get install libdnnl-dev; scripts/setup.sh does). "
                      "${_onednn_off_hint}")
endif()

file(STRINGS "${DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _onednn_defines
     REGEX "define DNNL_VERSION_(MAJOR|MINOR|PATCH) ")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX REPLACE ".*DNNL_VERSION_${_part} ([0-9]+).*" "\\1" _onednn_${_part} "${_onednn_defines}")
endforeach()
set(TVM_HETERO_ONEDNN_VERSION "${_onednn_MAJOR}.${_onednn_MINOR}.${_onednn_PATCH}")
if(NOT _onednn_MAJOR EQUAL 2)
  message(FATAL_ERROR "oneDNN ${TVM_HETERO_ONEDNN_VERSION} found (${DNNL_LIBRARY}), but the dnnl backend needs "
                      "2.x (Debian/Ubuntu: libdnnl-dev). ${_onednn_off_hint}")
endif()
message(STATUS "oneDNN ${TVM_HETERO_ONEDNN_VERSION}: ${DNNL_LIBRARY} (dnnl backend built in)")

/*!
 * \file build_info.cc
 * \brief What this library was built with (package version, the apache-tvm release, oneDNN), for
 *        `tvm_hetero.__version__`, `tvm-hetero --version` and the build report.
 *
 * The values are fixed by CMake at configure time (CMakeLists.txt), so an installed wheel answers
 * for itself rather than for whatever source tree is nearby.
 */
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

namespace tvm_hetero {
namespace {

namespace ffi = tvm::ffi;

/*! \brief Backends compiled into this library (dnnl only with oneDNN; accelerator regions need nothing at build time). */
ffi::Array<ffi::String> BuiltBackends() {
  ffi::Array<ffi::String> out;
#ifdef TVM_HETERO_WITH_ONEDNN
  out.push_back("dnnl");
#endif
  out.push_back("ep_regions");
  return out;
}

ffi::Map<ffi::String, ffi::Any> BuildInfo() {
  return ffi::Map<ffi::String, ffi::Any>{
      {"package", ffi::String(TVM_HETERO_PACKAGE_VERSION)},
      {"tvm", ffi::String(TVM_HETERO_BUILT_WITH_TVM)},
      // "" when built without oneDNN; the oneDNN actually loaded reports itself (tvm_hetero.dnnl.info).
      {"onednn", ffi::String(TVM_HETERO_BUILT_WITH_ONEDNN)},
      {"backends", BuiltBackends()},
  };
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  tvm::ffi::reflection::GlobalDef().def("tvm_hetero.build_info", BuildInfo);
}

}  // namespace tvm_hetero

/*!
 * \file backends/onnx_ep/ep_region_module.cc
 * \brief Accelerator regions in the kernel library: a binary-serializable module (kind
 *        "tvm_hetero_ep_regions") holding each region's finalized vendor graph (an EP-context ONNX
 *        model) and how its arguments bind to the graph's inputs.
 *
 * The graphs run through an ONNX Runtime execution provider of the device's vendor, which this
 * library reaches only through Python (the vendors' and ONNX Runtime's C headers are not part of
 * this build): a function of this module is made by the global
 * `tvm_hetero.ep_regions.make_region_runner`, which the Python package registers
 * (python/tvm_hetero/ep_offload/region_runner.py). In a process without it (the C++-only deploy
 * path) looking a region up fails with an error that says why, at runtime creation rather than mid-run.
 *
 * Document: an 8-byte little-endian length, a JSON header {"format", "regions": [{"name",
 * "offset", "size", "meta"}]}, then the regions' models back to back.
 */
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>

namespace tvm_hetero {
namespace ep_regions {

namespace ffi = tvm::ffi;

constexpr const char* kFormat = "tvm-hetero-ep-regions/1";
constexpr const char* kRunnerFactory = "tvm_hetero.ep_regions.make_region_runner";

/*! \brief One region: its model bytes and the binding metadata (JSON, read by the runner). */
struct EpRegion {
  std::string model;
  std::string meta;
};

class EpRegionModule : public ffi::ModuleObj {
 public:
  explicit EpRegionModule(const std::string& document) : document_(document) { Parse(); }

  const char* kind() const final { return "tvm_hetero_ep_regions"; }
  int GetPropertyMask() const final { return ffi::Module::kBinarySerializable | ffi::Module::kRunnable; }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    auto it = regions_.find(std::string(name));
    if (it == regions_.end()) return std::nullopt;
    ffi::Optional<ffi::Function> factory = ffi::Function::GetGlobal(kRunnerFactory);
    if (!factory.has_value()) {
      TVM_FFI_THROW(RuntimeError)
          << "accelerator region '" << std::string(name)
          << "' runs through its vendor's ONNX Runtime execution provider, which this library reaches only from "
             "Python: create the runtime from Python with tvm_hetero imported (and "
             "the vendor's extra of tvm-hetero installed); the C++-only deploy path cannot run accelerator regions";
    }
    const EpRegion& region = it->second;
    return (*factory)(name, ffi::Bytes(region.model.data(), region.model.size()), ffi::String(region.meta))
        .cast<ffi::Function>();
  }

  ffi::Bytes SaveToBytes() const final { return ffi::Bytes(document_.data(), document_.size()); }

  ffi::String InspectSource(const ffi::String& format) const final { return header_; }

 private:
  void Parse() {
    if (document_.size() < 8) TVM_FFI_THROW(ValueError) << "accelerator region module: a document of " << document_.size() << " bytes";
    uint64_t header_size = 0;
    std::memcpy(&header_size, document_.data(), 8);
    if (header_size > document_.size() - 8) {
      TVM_FFI_THROW(ValueError) << "accelerator region module: header of " << header_size << " bytes in a document of "
                                << document_.size();
    }
    header_ = std::string(document_.data() + 8, header_size);
    size_t blobs = 8 + header_size;
    ffi::json::Object header = ffi::json::Parse(header_).cast<ffi::json::Object>();
    std::string format = header.at("format").cast<ffi::String>();
    if (format != kFormat) {
      TVM_FFI_THROW(ValueError) << "accelerator region module: format '" << format << "', expected '" << kFormat << "'";
    }
    for (const ffi::Any& item : header.at("regions").cast<ffi::json::Array>()) {
      ffi::json::Object r = item.cast<ffi::json::Object>();
      std::string name = r.at("name").cast<ffi::String>();
      int64_t offset = r.at("offset").cast<int64_t>(), size = r.at("size").cast<int64_t>();
      if (offset < 0 || size < 0 || blobs + offset + size > document_.size()) {
        TVM_FFI_THROW(ValueError) << "accelerator region module: region '" << name << "' lies outside the document";
      }
      regions_[name] = EpRegion{document_.substr(blobs + offset, size), std::string(r.at("meta").cast<ffi::String>())};
    }
  }

  /*! \brief The document, saved verbatim. */
  std::string document_;
  /*! \brief Its JSON header (what InspectSource shows). */
  std::string header_;
  /*! \brief Every region, by name. */
  std::unordered_map<std::string, EpRegion> regions_;
};

ffi::Module CreateEpRegionModule(const std::string& document) {
  return ffi::Module(ffi::make_object<EpRegionModule>(document));
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def("tvm_hetero.ep_regions.create_module",
           [](ffi::Bytes document) { return CreateEpRegionModule(std::string(document)); })
      .def("ffi.Module.load_from_bytes.tvm_hetero_ep_regions",
           [](ffi::Bytes bytes) { return CreateEpRegionModule(std::string(bytes)); });
}

}  // namespace ep_regions
}  // namespace tvm_hetero

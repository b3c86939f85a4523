/*!
 * \file param_blob.cc
 * \brief Checked reader of `tvm.runtime.save_param_dict` bytes; see tvm_hetero/param_blob.h.
 *
 * Layout (little-endian): u64 magic, u64 reserved, u64 count, count x (u64 length, name bytes),
 * u64 count, then per tensor: u64 tensor magic, u64 reserved, i32 device type, i32 device id,
 * i32 ndim, u8 dtype code, u8 bits, u16 lanes, i64 shape[ndim], i64 data size, data.
 */
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>
#include <tvm_hetero/param_blob.h>

#include "support/device.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <unordered_set>

namespace tvm_hetero {

namespace ffi = tvm::ffi;

namespace {

constexpr uint64_t kParamListMagic = 0xF7E58D4F05049CB7ULL;
constexpr uint64_t kTensorMagic = 0xDD5E40F096B4A13FULL;
/*! \brief More dimensions than any tensor of a graph has: a larger ndim is corruption. */
constexpr int32_t kMaxDims = 32;

/*! \brief Reads fixed-size fields, throwing with the offset and the field when bytes run out. */
class Cursor {
 public:
  Cursor(const std::string& bytes, const std::string& what) : bytes_(bytes), what_(what) {}

  template <typename T>
  T Read(const std::string& field) {
    T value;
    std::memcpy(&value, Take(sizeof(T), field), sizeof(T));
    return value;
  }

  const char* Take(uint64_t n, const std::string& field) {
    if (n > Remaining()) {
      TVM_FFI_THROW(ValueError) << what_ << ": truncated or corrupt: " << field << " needs " << n
                                << " bytes at offset " << pos_ << ", but the data is " << bytes_.size()
                                << " bytes";
    }
    const char* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }

  uint64_t Remaining() const { return bytes_.size() - pos_; }
  uint64_t pos() const { return pos_; }

 private:
  const std::string& bytes_;
  const std::string& what_;
  uint64_t pos_ = 0;
};

}  // namespace

std::vector<NamedParam> ReadParamBlob(const std::string& bytes, const std::string& what) {
  Cursor in(bytes, what);
  if (in.Read<uint64_t>("the header") != kParamListMagic) {
    TVM_FFI_THROW(ValueError) << what << ": not a parameter file (bad magic number)";
  }
  in.Read<uint64_t>("the header");
  uint64_t num_names = in.Read<uint64_t>("the name count");
  // Each name takes at least its 8-byte length: a larger count cannot fit in the bytes present.
  if (num_names > in.Remaining() / 8) {
    TVM_FFI_THROW(ValueError) << what << ": corrupt: claims " << num_names << " parameters in " << bytes.size()
                              << " bytes";
  }
  std::vector<NamedParam> params(num_names);
  std::unordered_set<std::string> seen;
  for (uint64_t i = 0; i < num_names; ++i) {
    std::string field = "the name of parameter " + std::to_string(i);
    uint64_t length = in.Read<uint64_t>(field);
    params[i].name.assign(in.Take(length, field), length);
    if (!seen.insert(params[i].name).second) {
      TVM_FFI_THROW(ValueError) << what << ": parameter '" << params[i].name << "' appears twice";
    }
  }
  uint64_t num_tensors = in.Read<uint64_t>("the tensor count");
  if (num_tensors != num_names) {
    TVM_FFI_THROW(ValueError) << what << ": corrupt: " << num_names << " names but " << num_tensors << " tensors";
  }
  for (NamedParam& param : params) {
    std::string field = "parameter '" + param.name + "'";
    if (in.Read<uint64_t>(field) != kTensorMagic) {
      TVM_FFI_THROW(ValueError) << what << ": " << field << ": corrupt (bad tensor magic number at offset "
                                << in.pos() - 8 << ")";
    }
    in.Read<uint64_t>(field);
    in.Read<int32_t>(field);  // device the tensor was saved from: values load onto the host
    in.Read<int32_t>(field);
    int32_t ndim = in.Read<int32_t>(field);
    DLDataType dtype;
    dtype.code = in.Read<uint8_t>(field);
    dtype.bits = in.Read<uint8_t>(field);
    dtype.lanes = in.Read<uint16_t>(field);
    if (ndim < 0 || ndim > kMaxDims) {
      TVM_FFI_THROW(ValueError) << what << ": " << field << ": corrupt (ndim " << ndim << ")";
    }
    bool known_code = dtype.code == kDLInt || dtype.code == kDLUInt || dtype.code == kDLFloat ||
                      dtype.code == kDLBfloat || dtype.code == kDLBool;
    if (!known_code || dtype.bits == 0 || dtype.bits % 8 != 0 || dtype.lanes == 0) {
      TVM_FFI_THROW(ValueError) << what << ": " << field << ": corrupt (dtype code " << int(dtype.code) << ", "
                                << int(dtype.bits) << " bits, " << dtype.lanes << " lanes)";
    }
    std::vector<int64_t> shape(ndim);
    // The element count saturates instead of overflowing; the data is then checked against the
    // bytes present (Take) before anything is allocated.
    const uint64_t element_bytes = uint64_t(dtype.bits / 8) * dtype.lanes;
    const uint64_t max_elements = std::numeric_limits<uint64_t>::max() / element_bytes;
    uint64_t elements = 1;
    bool too_large = false;
    for (int32_t d = 0; d < ndim; ++d) {
      shape[d] = in.Read<int64_t>(field);
      if (shape[d] < 0) TVM_FFI_THROW(ValueError) << what << ": " << field << ": negative dimension " << shape[d];
      if (shape[d] != 0 && elements > max_elements / uint64_t(shape[d])) too_large = true;
      if (!too_large) elements *= uint64_t(shape[d]);
    }
    uint64_t data_size = in.Read<uint64_t>(field);
    if (too_large || data_size != elements * element_bytes) {
      std::ostringstream shape_text;
      for (int32_t d = 0; d < ndim; ++d) shape_text << (d ? ", " : "") << shape[d];
      TVM_FFI_THROW(ValueError) << what << ": " << field << ": corrupt: shape (" << shape_text.str() << ") of "
                                << ffi::DLDataTypeToString(dtype) << " does not match its data size "
                                << data_size;
    }
    const char* data = in.Take(data_size, field + " data");
    param.value = support::AllocTensor(ffi::Shape(shape), dtype, DLDevice{kDLCPU, 0});
    if (data_size) std::memcpy(param.value.data_ptr(), data, data_size);
  }
  if (in.Remaining() != 0) {
    TVM_FFI_THROW(ValueError) << what << ": corrupt: " << in.Remaining() << " unexpected bytes after the last parameter";
  }
  return params;
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  // read_params(bytes, what) -> {name: host tensor}, every size checked (tvm_hetero/param_blob.h).
  refl::GlobalDef().def("tvm_hetero.read_params", [](ffi::Bytes bytes, ffi::String what) {
    ffi::Map<ffi::String, ffi::Tensor> out;
    for (NamedParam& p : ReadParamBlob(std::string(bytes), std::string(what))) out.Set(p.name, p.value);
    return out;
  });
}

}  // namespace tvm_hetero

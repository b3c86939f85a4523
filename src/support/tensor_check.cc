/*!
 * \file support/tensor_check.cc
 * \brief Shape, dtype and contiguity checks with messages that name the tensor.
 */
#include "support/tensor_check.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <sstream>

namespace tvm_hetero {
namespace support {

namespace ffi = tvm::ffi;

std::string ShapeString(const int64_t* shape, int ndim) {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[i];
  os << (ndim == 1 ? ",)" : ")");
  return os.str();
}

std::string TypeString(const int64_t* shape, int ndim, DLDataType dtype) {
  return ShapeString(shape, ndim) + " " + std::string(ffi::DLDataTypeToString(dtype));
}

bool SameDType(DLDataType a, DLDataType b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; }

bool SameType(const DLTensor* t, const std::vector<int64_t>& shape, DLDataType dtype) {
  return t->ndim == static_cast<int>(shape.size()) && std::equal(shape.begin(), shape.end(), t->shape) &&
         SameDType(t->dtype, dtype);
}

bool IsContiguous(const DLTensor* t) {
  if (t->strides == nullptr) return true;
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expected) return false;
    expected *= t->shape[i];
  }
  return true;
}

void CheckTensor(const DLTensor* value, const std::vector<int64_t>& shape, DLDataType dtype, const std::string& what) {
  bool same_shape = value->ndim == static_cast<int>(shape.size()) && std::equal(shape.begin(), shape.end(), value->shape);
  if (!same_shape) {
    TVM_FFI_THROW(ValueError) << what << ": expected shape " << ShapeString(shape.data(), static_cast<int>(shape.size()))
                              << ", got " << ShapeString(value->shape, value->ndim);
  }
  if (!SameDType(value->dtype, dtype)) {
    TVM_FFI_THROW(TypeError) << what << ": expected dtype " << ffi::DLDataTypeToString(dtype) << ", got "
                             << ffi::DLDataTypeToString(value->dtype);
  }
  if (!IsContiguous(value)) TVM_FFI_THROW(ValueError) << what << ": tensor must be contiguous";
}

}  // namespace support
}  // namespace tvm_hetero

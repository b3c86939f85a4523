/*!
 * \file support/index_error.cc
 * \brief `tvm_hetero.index_out_of_range(where, tensor, value, position, low, high, *shape)`: the
 *        packed function an index-check kernel (python/tvm_hetero/compiler/index_checks.py) calls on
 *        the first index outside [low, high). It always throws (kind IndexError); the kernel returns
 *        the error before any index reaches the op, and the runtime adds the graph node and device.
 *        Only the failing path reaches it, so it may allocate.
 */
#include "support/index_error.h"

#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include <sstream>

namespace tvm_hetero {
namespace support {

namespace ffi = tvm::ffi;

std::string ElementName(const std::string& tensor, int64_t position, const std::vector<int64_t>& shape) {
  int64_t size = 1;
  for (int64_t dim : shape) size *= dim;
  std::ostringstream os;
  os << tensor << "[";
  if (position < 0 || position >= size || shape.empty()) {
    if (!shape.empty() || position != 0) os << position;  // a flat position, when it cannot be unravelled
  } else {
    std::vector<int64_t> coordinates(shape.size());
    for (size_t axis = shape.size(); axis-- > 0;) {
      coordinates[axis] = position % shape[axis];
      position /= shape[axis];
    }
    for (size_t axis = 0; axis < coordinates.size(); ++axis) os << (axis ? ", " : "") << coordinates[axis];
  }
  os << "]";
  return os.str();
}

std::string IndexErrorMessage(const std::string& where, const std::string& tensor, int64_t value,
                              int64_t position, const std::vector<int64_t>& shape, int64_t low, int64_t high) {
  std::ostringstream os;
  os << where << ": index " << value << " at " << ElementName(tensor, position, shape) << " is outside [" << low
     << ", " << high << ")";
  return os.str();
}

namespace {

void IndexOutOfRange(ffi::PackedArgs args, ffi::Any* /*rv*/) {
  constexpr int kFixed = 6;  // where, tensor, value, position, low, high; the tensor's shape follows
  if (args.size() < kFixed) {
    TVM_FFI_THROW(TypeError) << "tvm_hetero.index_out_of_range expects at least " << kFixed << " arguments, got "
                             << args.size();
  }
  std::vector<int64_t> shape;
  for (int i = kFixed; i < args.size(); ++i) shape.push_back(args[i].cast<int64_t>());
  TVM_FFI_THROW(IndexError) << IndexErrorMessage(args[0].cast<ffi::String>(), args[1].cast<ffi::String>(),
                                                 args[2].cast<int64_t>(), args[3].cast<int64_t>(), shape,
                                                 args[4].cast<int64_t>(), args[5].cast<int64_t>());
}

}  // namespace

}  // namespace support
}  // namespace tvm_hetero

TVM_FFI_STATIC_INIT_BLOCK() {
  tvm::ffi::reflection::GlobalDef().def_packed("tvm_hetero.index_out_of_range",
                                               tvm_hetero::support::IndexOutOfRange);
}

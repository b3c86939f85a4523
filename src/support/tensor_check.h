/*!
 * \file support/tensor_check.h
 * \brief One check that a caller's tensor fits a slot (shape, dtype, contiguity); every message
 *        names the tensor.
 */
#ifndef TVM_HETERO_SUPPORT_TENSOR_CHECK_H_
#define TVM_HETERO_SUPPORT_TENSOR_CHECK_H_

#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tvm_hetero {
namespace support {

/*! \brief "(4, 8)", "(3,)", "()". */
std::string ShapeString(const int64_t* shape, int ndim);
/*! \brief "(4, 8) float32". */
std::string TypeString(const int64_t* shape, int ndim, DLDataType dtype);
bool SameDType(DLDataType a, DLDataType b);
/*! \brief Same shape and dtype. */
bool SameType(const DLTensor* t, const std::vector<int64_t>& shape, DLDataType dtype);
/*! \brief Row-major with no gaps (strides absent or equal to the compact ones). */
bool IsContiguous(const DLTensor* t);
/*! \brief Throw naming `what` unless `value` has this shape and dtype and is contiguous
 *         (ValueError for shape and layout, TypeError for dtype). */
void CheckTensor(const DLTensor* value, const std::vector<int64_t>& shape, DLDataType dtype, const std::string& what);

}  // namespace support
}  // namespace tvm_hetero

#endif  // TVM_HETERO_SUPPORT_TENSOR_CHECK_H_

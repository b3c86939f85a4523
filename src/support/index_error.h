/*!
 * \file support/index_error.h
 * \brief The error of an index outside its tensor: compiled index checks call
 *        `tvm_hetero.index_out_of_range` (registered in index_error.cc) with the offending value,
 *        and it throws an IndexError naming the op, the input, the element and the bound.
 */
#ifndef TVM_HETERO_SUPPORT_INDEX_ERROR_H_
#define TVM_HETERO_SUPPORT_INDEX_ERROR_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tvm_hetero {
namespace support {

/*! \brief "ids[1, 2]": the element at row-major `position` of `tensor`, of shape `shape`
 *         ("ids[7]" when the position lies outside the shape, "ids[]" for a scalar). */
std::string ElementName(const std::string& tensor, int64_t position, const std::vector<int64_t>& shape);

/*! \brief "<where>: index <value> at <element> is outside [<low>, <high>)". */
std::string IndexErrorMessage(const std::string& where, const std::string& tensor, int64_t value,
                              int64_t position, const std::vector<int64_t>& shape, int64_t low, int64_t high);

}  // namespace support
}  // namespace tvm_hetero

#endif  // TVM_HETERO_SUPPORT_INDEX_ERROR_H_

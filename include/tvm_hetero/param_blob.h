/*!
 * \file tvm_hetero/param_blob.h
 * \brief A checked reader of `tvm.runtime.save_param_dict` bytes (params.bin).
 *
 * Guarantee: every length, count and shape in the bytes is checked against the bytes actually
 * present before anything is allocated, so a truncated or corrupted blob is an error naming the
 * parameter (and `what`, e.g. the file) — never uninitialised memory, a huge allocation or a crash.
 */
#ifndef TVM_HETERO_PARAM_BLOB_H_
#define TVM_HETERO_PARAM_BLOB_H_

#include <tvm/ffi/container/tensor.h>

#include <string>
#include <vector>

namespace tvm_hetero {

/*! \brief One parameter of a blob: its name and its value (a host tensor). */
struct NamedParam {
  std::string name;
  tvm::ffi::Tensor value;
};

/*!
 * \brief Parse a whole parameter blob.
 * \param bytes The blob.
 * \param what Named in errors, e.g. "params.bin" or "load_params".
 * \return The parameters in the blob's order; names are unique.
 */
std::vector<NamedParam> ReadParamBlob(const std::string& bytes, const std::string& what);

}  // namespace tvm_hetero

#endif  // TVM_HETERO_PARAM_BLOB_H_

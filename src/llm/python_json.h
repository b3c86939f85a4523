/*!
 * \file llm/python_json.h
 * \brief A JSON value written exactly as Python's `json.dumps(value, sort_keys=True)` writes it, so
 *        the C++ loader recomputes the manifest checksum that artifact.py's manifest_digest recorded.
 *
 * Python's rules: separators ", " and ": ", keys sorted by code point, non-ASCII characters as
 * \uXXXX (surrogate pairs beyond the BMP), floats as repr() (shortest round trip; positional for
 * exponents -4..15 with ".0" on whole numbers, else d.ddde+XX).
 */
#ifndef TVM_HETERO_LLM_PYTHON_JSON_H_
#define TVM_HETERO_LLM_PYTHON_JSON_H_

#include <tvm/ffi/any.h>

#include <string>

namespace tvm_hetero {
namespace llm {

/*! \brief `value` (from tvm::ffi::json::Parse) as Python's json.dumps(value, sort_keys=True). */
std::string PythonJsonDumps(const tvm::ffi::Any& value);

}  // namespace llm
}  // namespace tvm_hetero

#endif  // TVM_HETERO_LLM_PYTHON_JSON_H_

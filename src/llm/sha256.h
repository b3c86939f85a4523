/*!
 * \file llm/sha256.h
 * \brief SHA-256 (FIPS 180-4) as lowercase hex, for the checksums an exported directory's manifest
 *        records (artifact.py's sha256).
 */
#ifndef TVM_HETERO_LLM_SHA256_H_
#define TVM_HETERO_LLM_SHA256_H_

#include <string>

namespace tvm_hetero {
namespace llm {

/*! \brief The SHA-256 digest of `data`, 64 lowercase hex digits. */
std::string Sha256Hex(const std::string& data);

}  // namespace llm
}  // namespace tvm_hetero

#endif  // TVM_HETERO_LLM_SHA256_H_

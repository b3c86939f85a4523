/*!
 * \file support/json_reader.h
 * \brief The one reader of the library's JSON documents (graph JSON, pipeline wiring, oneDNN
 *        regions): typed access where every error says which document and where in it (node,
 *        field, list position), as "<document>: <where>: <what>" (ValueError).
 */
#ifndef TVM_HETERO_SUPPORT_JSON_READER_H_
#define TVM_HETERO_SUPPORT_JSON_READER_H_

#include <tvm/ffi/any.h>
#include <tvm/ffi/extra/json.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace tvm_hetero {
namespace support {

class JsonReader {
 public:
  /*! \param document How errors begin, e.g. "invalid graph JSON". */
  explicit JsonReader(std::string document) : document_(std::move(document)) {}

  /*! \brief Parse `text`; a syntax error is reported at `where`. */
  tvm::ffi::json::Value Parse(const std::string& text, const std::string& where = "document") const;
  [[noreturn]] void Fail(const std::string& where, const std::string& what) const;

  tvm::ffi::json::Object Object(const tvm::ffi::Any& v, const std::string& where) const;
  tvm::ffi::json::Array Array(const tvm::ffi::Any& v, const std::string& where) const;
  std::string String(const tvm::ffi::Any& v, const std::string& where) const;
  /*! \brief An integer; with `decimal_strings`, also "12" (the classic graph format writes those). */
  int64_t Int(const tvm::ffi::Any& v, const std::string& where, bool decimal_strings = false) const;
  bool Bool(const tvm::ffi::Any& v, const std::string& where) const;
  std::vector<int64_t> IntList(const tvm::ffi::Any& v, const std::string& where) const;

  /*! \brief The field, or nothing when absent. */
  static std::optional<tvm::ffi::Any> Find(const tvm::ffi::json::Object& obj, const char* key);
  /*! \brief The field; absent: "missing field 'key'" at `where`. */
  tvm::ffi::Any Require(const tvm::ffi::json::Object& obj, const char* key, const std::string& where) const;
  /*! \brief Fail naming the first key of `obj` not in `known` (catches typos). */
  void CheckKeys(const tvm::ffi::json::Object& obj, std::initializer_list<const char*> known,
                 const std::string& where) const;

 private:
  std::string document_;
};

}  // namespace support
}  // namespace tvm_hetero

#endif  // TVM_HETERO_SUPPORT_JSON_READER_H_

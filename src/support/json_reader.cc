/*!
 * \file support/json_reader.cc
 * \brief Typed JSON access with errors that carry the document and the place in it.
 */
#include "support/json_reader.h"

#include <tvm/ffi/error.h>
#include <tvm/ffi/string.h>

#include <algorithm>

namespace tvm_hetero {
namespace support {

namespace ffi = tvm::ffi;
namespace json = tvm::ffi::json;

json::Value JsonReader::Parse(const std::string& text, const std::string& where) const {
  ffi::String error;
  json::Value root = json::Parse(ffi::String(text), &error);
  if (!error.empty()) Fail(where, "not valid JSON: " + std::string(error));
  return root;
}

void JsonReader::Fail(const std::string& where, const std::string& what) const {
  TVM_FFI_THROW(ValueError) << document_ << ": " << where << ": " << what;
  TVM_FFI_UNREACHABLE();
}

json::Object JsonReader::Object(const ffi::Any& v, const std::string& where) const {
  if (auto obj = v.try_cast<json::Object>()) return *obj;
  Fail(where, "expected an object");
}

json::Array JsonReader::Array(const ffi::Any& v, const std::string& where) const {
  if (auto arr = v.try_cast<json::Array>()) return *arr;
  Fail(where, "expected a list");
}

std::string JsonReader::String(const ffi::Any& v, const std::string& where) const {
  if (auto s = v.try_cast<ffi::String>()) return std::string(*s);
  Fail(where, "expected a string");
}

int64_t JsonReader::Int(const ffi::Any& v, const std::string& where, bool decimal_strings) const {
  if (v.type_index() == ffi::TypeIndex::kTVMFFIInt) return v.cast<int64_t>();
  if (auto s = v.try_cast<ffi::String>(); s && decimal_strings) {
    std::string text(*s);
    size_t used = 0;
    try {
      int64_t value = std::stoll(text, &used);
      if (used == text.size() && !text.empty()) return value;
    } catch (const std::exception&) {
    }
    Fail(where, "'" + text + "' is not an integer");
  }
  Fail(where, "expected an integer");
}

bool JsonReader::Bool(const ffi::Any& v, const std::string& where) const {
  if (v.type_index() == ffi::TypeIndex::kTVMFFIBool) return v.cast<bool>();
  Fail(where, "expected true or false");
}

std::vector<int64_t> JsonReader::IntList(const ffi::Any& v, const std::string& where) const {
  std::vector<int64_t> out;
  json::Array items = Array(v, where);
  for (size_t i = 0; i < items.size(); ++i) out.push_back(Int(items[i], where + "[" + std::to_string(i) + "]"));
  return out;
}

std::optional<ffi::Any> JsonReader::Find(const json::Object& obj, const char* key) {
  auto it = obj.find(ffi::String(key));
  if (it == obj.end()) return std::nullopt;
  return (*it).second;
}

ffi::Any JsonReader::Require(const json::Object& obj, const char* key, const std::string& where) const {
  auto v = Find(obj, key);
  if (!v) Fail(where, std::string("missing field '") + key + "'");
  return *v;
}

void JsonReader::CheckKeys(const json::Object& obj, std::initializer_list<const char*> known,
                           const std::string& where) const {
  for (const auto& [key, value] : obj) {
    std::string k = String(key, where);
    bool ok = std::any_of(known.begin(), known.end(), [&](const char* name) { return k == name; });
    if (!ok) Fail(where, "unknown field '" + k + "'");
  }
}

}  // namespace support
}  // namespace tvm_hetero

/*!
 * \file llm/python_json.cc
 * \brief Python's json.dumps(sort_keys=True), byte for byte (llm/python_json.h).
 */
#include "llm/python_json.h"

#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

namespace tvm_hetero {
namespace llm {

namespace ffi = tvm::ffi;
namespace json = tvm::ffi::json;

namespace {

void AppendEscapedUnit(std::string* out, uint32_t unit) {
  char buffer[8];
  std::snprintf(buffer, sizeof(buffer), "\\u%04x", unit);
  *out += buffer;
}

/*! \brief A string as Python's ensure_ascii encoder writes it (UTF-8 in, ASCII out). */
void AppendString(std::string* out, const std::string& text) {
  *out += '"';
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': *out += "\\\""; break;
        case '\\': *out += "\\\\"; break;
        case '\n': *out += "\\n"; break;
        case '\r': *out += "\\r"; break;
        case '\t': *out += "\\t"; break;
        case '\b': *out += "\\b"; break;
        case '\f': *out += "\\f"; break;
        default:
          if (c < 0x20) AppendEscapedUnit(out, c); else *out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    uint32_t code = c & (0x3F >> extra);
    for (int k = 1; k <= extra && i + k < text.size(); ++k) code = (code << 6) | (text[i + k] & 0x3F);
    i += extra + 1;
    if (code >= 0x10000) {
      code -= 0x10000;
      AppendEscapedUnit(out, 0xD800 | (code >> 10));
      AppendEscapedUnit(out, 0xDC00 | (code & 0x3FF));
    } else {
      AppendEscapedUnit(out, code);
    }
  }
  *out += '"';
}

/*! \brief A float as Python's repr(). */
void AppendFloat(std::string* out, double value) {
  if (std::isnan(value)) { *out += "NaN"; return; }
  if (std::isinf(value)) { *out += value > 0 ? "Infinity" : "-Infinity"; return; }
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string sci(buffer, result.ptr);  // [-]d[.ddd]e[+-]XX, the shortest digits that round-trip
  size_t e = sci.find('e');
  int exponent = std::stoi(sci.substr(e + 1));
  std::string sign = sci[0] == '-' ? "-" : "";
  std::string digits;
  for (size_t k = sign.size(); k < e; ++k) {
    if (sci[k] != '.') digits += sci[k];
  }
  if (exponent < -4 || exponent >= 16) {
    std::string mantissa = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    char exp_text[16];
    std::snprintf(exp_text, sizeof(exp_text), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    *out += sign + mantissa + exp_text;
    return;
  }
  std::string text;
  if (exponent < 0) {
    text = "0." + std::string(-exponent - 1, '0') + digits;
  } else if (static_cast<int>(digits.size()) <= exponent + 1) {
    text = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
  } else {
    text = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
  }
  *out += sign + text;
}

void Append(std::string* out, const ffi::Any& value) {
  switch (value.type_index()) {
    case ffi::TypeIndex::kTVMFFINone: *out += "null"; return;
    case ffi::TypeIndex::kTVMFFIBool: *out += value.cast<bool>() ? "true" : "false"; return;
    case ffi::TypeIndex::kTVMFFIInt: *out += std::to_string(value.cast<int64_t>()); return;
    case ffi::TypeIndex::kTVMFFIFloat: AppendFloat(out, value.cast<double>()); return;
    default: break;
  }
  if (auto text = value.try_cast<ffi::String>()) {
    AppendString(out, std::string(*text));
  } else if (auto items = value.try_cast<json::Array>()) {
    *out += '[';
    for (size_t i = 0; i < items->size(); ++i) {
      if (i) *out += ", ";
      Append(out, (*items)[i]);
    }
    *out += ']';
  } else if (auto object = value.try_cast<json::Object>()) {
    std::vector<std::pair<std::string, ffi::Any>> fields;
    for (const auto& [key, field] : *object) fields.emplace_back(std::string(key.cast<ffi::String>()), field);
    // UTF-8 byte order is code point order, which is what Python sorts by.
    std::sort(fields.begin(), fields.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    *out += '{';
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i) *out += ", ";
      AppendString(out, fields[i].first);
      *out += ": ";
      Append(out, fields[i].second);
    }
    *out += '}';
  } else {
    TVM_FFI_THROW(TypeError) << "python json: a value of type " << value.GetTypeKey() << " has no JSON form";
  }
}

}  // namespace

std::string PythonJsonDumps(const ffi::Any& value) {
  std::string out;
  Append(&out, value);
  return out;
}

}  // namespace llm
}  // namespace tvm_hetero

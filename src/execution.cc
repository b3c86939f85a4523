/*!
 * \file execution.cc
 * \brief Parsing the execution mode and per-device executor options (errors name device and field).
 */
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm_hetero/execution.h>

#include <thread>

namespace tvm_hetero {

namespace ffi = tvm::ffi;

ExecutionMode ParseExecutionMode(const std::string& name) {
  if (name == "serial") return ExecutionMode::kSerial;
  if (name == "concurrent") return ExecutionMode::kConcurrent;
  TVM_FFI_THROW(ValueError) << "execution must be 'concurrent' or 'serial', got '" << name << "'";
}

bool HasExecutorOptions(const std::vector<ExecutorOptions>& options) {
  for (const ExecutorOptions& o : options) {
    if (!o.empty()) return true;
  }
  return false;
}

std::vector<ExecutorOptions> ParseExecutorOptions(const std::string& text, int num_devices) {
  namespace json = ffi::json;
  std::vector<ExecutorOptions> options(num_devices);
  if (text.empty() || text == "null") return options;
  json::Value parsed = json::Parse(text);
  auto list = parsed.try_cast<json::Array>();
  if (!list.has_value()) TVM_FFI_THROW(TypeError) << "device_options must be a list with one entry per device";
  if (static_cast<int>(list->size()) > num_devices) {
    TVM_FFI_THROW(ValueError) << "device_options has " << list->size() << " entries for " << num_devices
                              << " devices";
  }
  const int num_cores = static_cast<int>(std::thread::hardware_concurrency());
  for (int d = 0; d < static_cast<int>(list->size()); ++d) {
    const ffi::Any& item = (*list)[d];
    if (item == nullptr) continue;
    auto object = item.try_cast<json::Object>();
    if (!object.has_value()) TVM_FFI_THROW(TypeError) << "device_options[" << d << "] must be a dict or None";
    for (const auto& [key, value] : *object) {
      std::string field = key.cast<ffi::String>();
      std::string where = "device_options[" + std::to_string(d) + "]['" + field + "']";
      if (field == "cores") {
        auto cores = value.try_cast<json::Array>();
        if (!cores.has_value()) TVM_FFI_THROW(TypeError) << where << " must be a list of core numbers";
        for (const ffi::Any& core : *cores) {
          auto c = core.try_cast<int64_t>();
          if (!c.has_value() || *c < 0 || (num_cores > 0 && *c >= num_cores)) {
            TVM_FFI_THROW(ValueError) << where << ": " << json::Stringify(core)
                                      << " is not a core of this machine (it has " << num_cores << ")";
          }
          options[d].cores.push_back(static_cast<int>(*c));
        }
      } else if (field == "num_threads") {
        auto n = value.try_cast<int64_t>();
        if (!n.has_value() || *n < 0) TVM_FFI_THROW(ValueError) << where << " must be a non-negative integer";
        options[d].num_threads = static_cast<int>(*n);
      } else {
        TVM_FFI_THROW(ValueError) << "device_options[" << d << "]: unknown field '" << field
                                  << "' (expected 'cores', 'num_threads')";
      }
    }
  }
  return options;
}

}  // namespace tvm_hetero

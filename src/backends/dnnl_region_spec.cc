/*!
 * \file dnnl_region_spec.cc
 * \brief Reading the compiler's oneDNN region document (docs/byoc.md, "tvm-hetero-dnnl/1") into
 *        RegionSpecs, checked: every error names the region, the step and the field.
 *
 * A region is either one primitive (the fields of a step at the region's top level, roles being
 * the call's input positions) or a block: `"op": "block"` with `steps`, each step giving its own
 * roles as positions in its `args`, the value ids it reads. Guarantee: every parsed step reads
 * only values made before it (a call input or an earlier step's output), so executing the steps
 * in order is well defined.
 */
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm_hetero/backends/dnnl_region.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "backends/one_row_matmul.h"
#include "support/json_reader.h"

namespace tvm_hetero {
namespace dnnl_backend {

namespace ffi = tvm::ffi;
namespace json = tvm::ffi::json;

namespace {

const support::JsonReader kReader{"invalid oneDNN regions"};

std::vector<int64_t> IntList(const json::Object& obj, const char* key, const std::string& where) {
  auto v = support::JsonReader::Find(obj, key);
  return v ? kReader.IntList(*v, where + "." + key) : std::vector<int64_t>{};
}

int64_t IntOr(const json::Object& obj, const char* key, int64_t fallback, const std::string& where) {
  auto v = support::JsonReader::Find(obj, key);
  return v ? kReader.Int(*v, where + "." + key) : fallback;
}

bool BoolOr(const json::Object& obj, const char* key, bool fallback, const std::string& where) {
  auto v = support::JsonReader::Find(obj, key);
  return v ? kReader.Bool(*v, where + "." + key) : fallback;
}

double FloatOr(const json::Object& obj, const char* key, double fallback) {
  auto it = obj.find(ffi::String(key));
  if (it == obj.end()) return fallback;
  const ffi::Any& v = (*it).second;
  if (auto f = v.try_cast<double>()) return *f;
  return static_cast<double>(v.cast<int64_t>());
}

const char* const kOps[] = {"conv2d",          "matmul",  "max_pool2d", "avg_pool2d",
                            "channel_shuffle", "softmax", "layer_norm", "concat",
                            "lrn",    "scale_shift", "batch_matmul", "quantize",
                            "dequantize", "add", "int8_weight_matmul"};
const char* const kQuantTypes[] = {"u8", "s8", "f32"};
const char* const kActivations[] = {"clip", "sigmoid", "hardswish", "gelu", "gelu_tanh", "silu"};

std::string OneOf(const json::Object& obj, const char* key, const char* const* known, size_t n,
                  const std::string& where, bool optional) {
  auto v = support::JsonReader::Find(obj, key);
  if (!v) {
    if (optional) return "";
    kReader.Fail(where, std::string("missing field '") + key + "'");
  }
  std::string name = kReader.String(*v, where + "." + key);
  for (size_t i = 0; i < n; ++i) {
    if (name == known[i]) return name;
  }
  kReader.Fail(where, std::string("unknown ") + key + " '" + name + "'");
}

/*! \brief The step's `quant` object (absent: a float32 step). */
QuantSpec ParseQuant(const json::Object& step, const std::string& where) {
  QuantSpec q;
  auto v = support::JsonReader::Find(step, "quant");
  if (!v) return q;
  std::string at = where + ".quant";
  json::Object obj = kReader.Object(*v, at);
  q.on = true;
  q.dst_type = OneOf(obj, "dst_type", kQuantTypes, sizeof(kQuantTypes) / sizeof(kQuantTypes[0]), at, false);
  json::Array scales = kReader.Array(kReader.Require(obj, "scales", at), at + ".scales");
  for (size_t i = 0; i < scales.size(); ++i) {
    const ffi::Any& x = scales[i];
    if (auto f = x.try_cast<double>()) {
      q.scales.push_back(static_cast<float>(*f));
    } else {
      q.scales.push_back(static_cast<float>(kReader.Int(x, at + ".scales")));
    }
  }
  if (q.scales.empty()) kReader.Fail(at, "no scales");
  q.src_zero_point = static_cast<int32_t>(IntOr(obj, "src_zero_point", 0, at));
  q.dst_zero_point = static_cast<int32_t>(IntOr(obj, "dst_zero_point", 0, at));
  q.shift = static_cast<float>(FloatOr(obj, "shift", 0.0));
  for (int64_t zp : IntList(obj, "src_zero_points", at)) q.src_zero_points.push_back(static_cast<int32_t>(zp));
  return q;
}

/*!
 * \brief One step; its roles are positions in `args` (the value ids it reads), or the value ids
 *        themselves when `args` is empty (a one-primitive region: its args are the call's inputs).
 */
StepSpec ParseStep(const json::Object& obj, const std::vector<int64_t>& args, int num_args, const std::string& where) {
  StepSpec s;
  s.op = OneOf(obj, "op", kOps, sizeof(kOps) / sizeof(kOps[0]), where, false);
  auto value = [&](int64_t local, const char* role) -> int {
    if (local < 0) return -1;
    if (local >= num_args) {
      kReader.Fail(where, std::string(role) + ": argument " + std::to_string(local) + " of " + std::to_string(num_args));
    }
    return static_cast<int>(args.empty() ? local : args[local]);
  };
  s.data = value(IntOr(obj, "data", 0, where), "data");
  s.weight = value(IntOr(obj, "weight", -1, where), "weight");
  s.bias = value(IntOr(obj, "bias", -1, where), "bias");
  s.residual = value(IntOr(obj, "residual", -1, where), "residual");
  s.scale = value(IntOr(obj, "scale", -1, where), "scale");
  s.zero_point = value(IntOr(obj, "zero_point", -1, where), "zero_point");
  for (int64_t local : IntList(obj, "inputs", where)) s.inputs.push_back(value(local, "inputs"));
  s.shape = IntList(obj, "shape", where);
  s.relu = BoolOr(obj, "relu", false, where);
  s.activation = OneOf(obj, "activation", kActivations, sizeof(kActivations) / sizeof(kActivations[0]), where, true);
  s.alpha = static_cast<float>(FloatOr(obj, "alpha", 0.0));
  s.beta = static_cast<float>(FloatOr(obj, "beta", 0.0));
  s.weight_transposed = BoolOr(obj, "weight_transposed", false, where);
  s.weight_panels = IntOr(obj, "weight_panels", 0, where);
  if (s.weight_panels != 0 && (s.weight_panels != one_row_matmul::kPanelWidth || s.weight_transposed)) {
    kReader.Fail(where, "weight_panels: " + std::to_string(s.weight_panels) + " (only " +
                            std::to_string(one_row_matmul::kPanelWidth) + ", of a weight not transposed)");
  }
  s.count_include_pad = BoolOr(obj, "count_include_pad", false, where);
  s.strides = IntList(obj, "strides", where);
  s.padding = IntList(obj, "padding", where);
  s.dilation = IntList(obj, "dilation", where);
  s.pool_size = IntList(obj, "pool_size", where);
  s.groups = IntOr(obj, "groups", 1, where);
  s.axis = IntOr(obj, "axis", -1, where);
  s.epsilon = static_cast<float>(FloatOr(obj, "epsilon", 1e-5));
  s.local_size = IntOr(obj, "local_size", 1, where);
  s.k = static_cast<float>(FloatOr(obj, "k", 1.0));
  s.quant = ParseQuant(obj, where);
  bool requant = s.op == "quantize" || s.op == "dequantize";
  if (requant && (!s.quant.on || s.quant.scales.size() != 1)) kReader.Fail(where, s.op + " needs quant with one scale");
  static const char* const kIntegerOps[] = {"conv2d", "matmul", "add", "max_pool2d", "avg_pool2d", "concat",
                                            "scale_shift"};
  bool integer_op = std::any_of(std::begin(kIntegerOps), std::end(kIntegerOps), [&](const char* op) { return s.op == op; });
  if (s.quant.on && !requant && !integer_op) {
    kReader.Fail(where, "only conv2d, matmul, add, pooling, concat and scale_shift run in integers, not " + s.op);
  }
  if (s.quant.on && s.op == "concat" &&
      (s.quant.scales.size() != s.inputs.size() || s.quant.src_zero_points.size() != s.inputs.size())) {
    kReader.Fail(where, "a concat in integers needs one scale and one source zero point per input");
  }
  if (s.op == "add" && (s.inputs.size() != 2 || !s.quant.on || s.quant.scales.size() != 2)) {
    kReader.Fail(where, "add needs two inputs and quant with two scales");
  }
  if (s.op == "lrn") s.beta = static_cast<float>(FloatOr(obj, "beta", 0.75));
  if (s.op == "scale_shift" && (s.weight < 0 || s.bias < 0)) kReader.Fail(where, "scale_shift needs a weight and a bias");
  if (s.op == "int8_weight_matmul" &&
      (s.weight < 0 || s.scale < 0 || s.zero_point < 0 || s.residual >= 0 || s.relu || !s.activation.empty() || s.quant.on)) {
    kReader.Fail(where, "int8_weight_matmul needs a weight, a scale and a zero point, and takes no residual, activation or quant");
  }
  if (s.op == "batch_matmul" && s.inputs.size() != 2) kReader.Fail(where, "batch_matmul needs two inputs");
  if (s.op == "concat" && s.inputs.size() < 2) kReader.Fail(where, "concat needs at least two inputs");
  return s;
}

/*! \brief The steps of a block region; each reads only the call's inputs and earlier steps. */
std::vector<StepSpec> ParseBlock(const json::Object& obj, int num_inputs, const std::string& where) {
  json::Array steps = kReader.Array(kReader.Require(obj, "steps", where), where + ".steps");
  if (steps.size() == 0) kReader.Fail(where, "a block has no steps");
  std::vector<StepSpec> out;
  for (size_t k = 0; k < steps.size(); ++k) {
    std::string at = where + ".steps[" + std::to_string(k) + "]";
    json::Object step = kReader.Object(steps[k], at);
    std::vector<int64_t> args = kReader.IntList(kReader.Require(step, "args", at), at + ".args");
    int64_t defined = num_inputs + static_cast<int64_t>(k);
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i] < 0 || args[i] >= defined) {
        kReader.Fail(at, "args[" + std::to_string(i) + "] is value " + std::to_string(args[i]) +
                             ", not an input nor an earlier step's output (" + std::to_string(defined) +
                             " values so far)");
      }
    }
    if (args.empty()) kReader.Fail(at, "a step reads no value");
    out.push_back(ParseStep(step, args, static_cast<int>(args.size()), at));
    if (k + 1 < steps.size() && out.back().shape.empty()) kReader.Fail(at, "missing field 'shape'");
  }
  return out;
}

}  // namespace

std::vector<RegionSpec> ParseRegions(const std::string& json_text) {
  json::Object top = kReader.Object(kReader.Parse(json_text), "document");
  json::Array regions = kReader.Array(kReader.Require(top, "regions", "document"), "field 'regions'");
  std::vector<RegionSpec> out;
  for (size_t k = 0; k < regions.size(); ++k) {
    std::string where = "regions[" + std::to_string(k) + "]";
    json::Object obj = kReader.Object(regions[k], where);
    RegionSpec r;
    r.name = kReader.String(kReader.Require(obj, "name", where), where + ".name");
    where = "region '" + r.name + "'";
    r.num_inputs = static_cast<int>(IntOr(obj, "num_inputs", 1, where));
    std::string op = kReader.String(kReader.Require(obj, "op", where), where + ".op");
    if (op == "block") {
      r.steps = ParseBlock(obj, r.num_inputs, where);
    } else {
      r.steps.push_back(ParseStep(obj, {}, r.num_inputs, where));
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace dnnl_backend
}  // namespace tvm_hetero

/*!
 * \file dnnl_region_module.cc
 * \brief The oneDNN backend at run time: one primitive (plus post-ops) per region call site, created
 *        on its first call; the module serializes to the compiler's JSON document.
 *
 * Life cycle of a call site, like the graph runtime's: the first call checks the arguments and
 * creates the primitive, the memory objects, the reorder primitives and every argument map; every
 * later call only points the memories at the arguments' data and executes -- no allocation, no map
 * building, no lock. Weights are reordered into the primitive's preferred layout once and kept
 * while the weight tensor's address and the module's parameter generation (bumped by the
 * cache-invalidation hook whenever parameters are set) stay the same (docs/byoc.md).
 *
 * Built without oneDNN (TVM_HETERO_WITH_ONEDNN undefined) the module still loads, saves and
 * lists its regions, and calling a region raises an error that says so.
 */
#include <tvm/ffi/cast.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm_hetero/backends/dnnl_region.h>
#include <tvm_hetero/graph_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>

#ifdef TVM_HETERO_WITH_ONEDNN
#include <dlfcn.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

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

const char* const kActivations[] = {"clip", "sigmoid", "hardswish", "gelu", "gelu_tanh", "silu"};

std::string ActivationOf(const json::Object& obj, const std::string& region) {
  auto it = obj.find(ffi::String("activation"));
  if (it == obj.end()) return "";
  std::string name((*it).second.cast<ffi::String>());
  for (const char* known : kActivations) {
    if (name == known) return name;
  }
  TVM_FFI_THROW(ValueError) << "oneDNN region '" << region << "': unknown activation '" << name << "'";
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
    r.op = kReader.String(kReader.Require(obj, "op", where), where + ".op");
    r.num_inputs = static_cast<int>(IntOr(obj, "num_inputs", 1, where));
    r.data = static_cast<int>(IntOr(obj, "data", 0, where));
    r.weight = static_cast<int>(IntOr(obj, "weight", -1, where));
    r.bias = static_cast<int>(IntOr(obj, "bias", -1, where));
    r.residual = static_cast<int>(IntOr(obj, "residual", -1, where));
    r.relu = BoolOr(obj, "relu", false, where);
    r.activation = ActivationOf(obj, r.name);
    r.alpha = static_cast<float>(FloatOr(obj, "alpha", 0.0));
    r.beta = static_cast<float>(FloatOr(obj, "beta", 0.0));
    r.weight_transposed = BoolOr(obj, "weight_transposed", false, where);
    r.count_include_pad = BoolOr(obj, "count_include_pad", false, where);
    r.strides = IntList(obj, "strides", where);
    r.padding = IntList(obj, "padding", where);
    r.dilation = IntList(obj, "dilation", where);
    r.pool_size = IntList(obj, "pool_size", where);
    r.groups = IntOr(obj, "groups", 1, where);
    r.axis = IntOr(obj, "axis", -1, where);
    r.epsilon = static_cast<float>(FloatOr(obj, "epsilon", 1e-5));
    for (int role : {r.data, r.weight, r.bias, r.residual}) {
      if (role >= r.num_inputs) {
        kReader.Fail(where, "argument " + std::to_string(role) + " of " + std::to_string(r.num_inputs));
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

#ifdef TVM_HETERO_WITH_ONEDNN

bool DnnlAvailable() { return true; }

namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

/*! \brief The CPU engine, shared by every region. */
const dnnl::engine& CpuEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

memory::dims Dims(const DLTensor* t) { return memory::dims(t->shape, t->shape + t->ndim); }

}  // namespace

/*!
 * \brief Scratch for the region's own layouts, per thread: src and dst of one call are live together.
 *        Grown on a thread's first call of a region that needs more, never shrunk or freed before
 *        the thread ends, so a steady-state call allocates nothing.
 */
class Scratch {
 public:
  ~Scratch() { std::free(data_); }
  void* Get(size_t nbytes) {
    if (nbytes > size_) {
      std::free(data_);
      size_ = (nbytes + kAlign - 1) / kAlign * kAlign;
      data_ = std::aligned_alloc(kAlign, size_);
      if (data_ == nullptr) TVM_FFI_THROW(RuntimeError) << "oneDNN region: out of memory for scratch";
    }
    return data_;
  }

 private:
  static constexpr size_t kAlign = 64;
  void* data_ = nullptr;
  size_t size_ = 0;
};
thread_local Scratch src_scratch, dst_scratch;

/*! \brief A reorder with its argument map, made once. */
struct PreparedReorder {
  dnnl::reorder prim;
  std::unordered_map<int, memory> args;
  PreparedReorder() = default;
  PreparedReorder(const memory& from, const memory& to)
      : prim(from, to), args{{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}} {}
  void Run(dnnl::stream& s) const { prim.execute(s, args); }
};

/*!
 * \brief One call site of a region: primitive, memories, reorders and argument maps, made on the
 *        first call; every later call points the memories at the arguments and executes.
 */
class RegionExec {
 public:
  RegionExec(RegionSpec spec, std::shared_ptr<std::atomic<uint64_t>> weights_generation)
      : spec_(std::move(spec)), weights_generation_(std::move(weights_generation)) {}

  /*! \brief Run with the call's tensors: inputs, then the output. */
  void Run(ffi::PackedArgs args) {
    if (args.size() != spec_.num_inputs + 1) {
      TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "' takes " << spec_.num_inputs
                                << " inputs and 1 output, got " << args.size() << " arguments";
    }
    if (!ready_) Setup(args);
    Execute(args);
  }

 private:
  static DLTensor* Arg(const ffi::PackedArgs& args, int i) { return args[i].cast<DLTensor*>(); }

  void Check(const ffi::PackedArgs& args) const {
    for (int i = 0; i < args.size(); ++i) {
      const DLTensor* x = Arg(args, i);
      bool f32 = x->dtype.code == kDLFloat && x->dtype.bits == 32 && x->dtype.lanes == 1;
      if (!f32 || x->device.device_type != kDLCPU || x->byte_offset != 0) {
        TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "': argument " << i
                                  << " must be a float32 CPU tensor without byte offset";
      }
    }
  }

  void Setup(const ffi::PackedArgs& args) {
    Check(args);
    std::vector<DLTensor*> t;
    for (int i = 0; i < args.size(); ++i) t.push_back(Arg(args, i));
    try {
      if (spec_.op == "conv2d") {
        SetupConv(t);
      } else if (spec_.op == "matmul") {
        SetupMatmul(t);
      } else if (spec_.op == "max_pool2d" || spec_.op == "avg_pool2d") {
        SetupPool(t);
      } else if (spec_.op == "channel_shuffle") {
        SetupChannelShuffle(t);
      } else if (spec_.op == "softmax") {
        SetupSoftmax(t);
      } else if (spec_.op == "layer_norm") {
        SetupLayerNorm(t);
      } else {
        TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "': unknown op '" << spec_.op << "'";
      }
      SetupArguments();
    } catch (const dnnl::error& e) {
      TVM_FFI_THROW(RuntimeError) << "oneDNN region '" << spec_.name << "' (" << spec_.op
                                  << "): cannot create the primitive: " << e.what();
    }
    ready_ = true;
  }

  /*! \brief A memory in `want`'s layout (data set per call) when it differs from `user`, else `user`. */
  static memory Reordered(const memory::desc& want, const memory& user, bool* differs) {
    *differs = want != user.get_desc();
    return *differs ? memory(want, CpuEngine(), nullptr) : user;
  }

  dnnl::primitive_attr PostOps(bool sum) const {
    dnnl::post_ops ops;
    if (sum) ops.append_sum(1.f);
    if (spec_.relu) ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    if (!spec_.activation.empty()) {
      float alpha = spec_.activation == "silu" ? 1.f : spec_.alpha;
      ops.append_eltwise(1.f, Activation(), alpha, spec_.beta);
    }
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    return attr;
  }

  /*! \brief oneDNN's algorithm for spec_.activation (checked when parsed); silu is swish with alpha 1. */
  dnnl::algorithm Activation() const {
    const std::string& a = spec_.activation;
    if (a == "clip") return dnnl::algorithm::eltwise_clip;
    if (a == "sigmoid") return dnnl::algorithm::eltwise_logistic;
    if (a == "hardswish") return dnnl::algorithm::eltwise_hardswish;
    if (a == "gelu") return dnnl::algorithm::eltwise_gelu_erf;
    if (a == "gelu_tanh") return dnnl::algorithm::eltwise_gelu_tanh;
    return dnnl::algorithm::eltwise_swish;
  }

  void SetupConv(const std::vector<DLTensor*>& t) {
    const DLTensor* x = t[spec_.data];
    const DLTensor* w = t[spec_.weight];
    const DLTensor* y = t.back();
    if (x->ndim != 4 || w->ndim != 4 || y->ndim != 4) {
      TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "': conv2d needs NCHW/OIHW tensors";
    }
    int64_t g = spec_.groups;
    memory::dims wdims = Dims(w);
    memory::desc user_w;
    if (g > 1) {
      wdims = {g, w->shape[0] / g, w->shape[1], w->shape[2], w->shape[3]};
      user_w = memory::desc(wdims, dt::f32, tag::goihw);
    } else {
      user_w = memory::desc(wdims, dt::f32, tag::oihw);
    }
    memory::dims dilation;
    for (int64_t d : spec_.dilation) dilation.push_back(d - 1);
    memory::dims pad_l{spec_.padding[0], spec_.padding[1]}, pad_r{spec_.padding[2], spec_.padding[3]};
    memory::desc src_any(Dims(x), dt::f32, tag::any), dst_any(Dims(y), dt::f32, tag::any);
    memory::desc w_any(wdims, dt::f32, tag::any);
    memory::desc b_md = spec_.bias >= 0 ? memory::desc({y->shape[1]}, dt::f32, tag::x) : memory::desc();
    memory::dims strides(spec_.strides.begin(), spec_.strides.end());
    dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                         src_any, w_any, b_md, dst_any, strides, dilation, pad_l, pad_r);
    dnnl::convolution_forward::primitive_desc pd(desc, PostOps(spec_.residual >= 0), CpuEngine());
    prim_ = dnnl::convolution_forward(pd);
    user_src_ = memory(memory::desc(Dims(x), dt::f32, tag::nchw), CpuEngine(), nullptr);
    user_dst_ = memory(memory::desc(Dims(y), dt::f32, tag::nchw), CpuEngine(), nullptr);
    user_wei_ = memory(user_w, CpuEngine(), nullptr);
    src_ = Reordered(pd.src_desc(), user_src_, &reorder_src_);
    dst_ = Reordered(pd.dst_desc(), user_dst_, &reorder_dst_);
    reorder_wei_ = pd.weights_desc() != user_wei_.get_desc();
    wei_ = reorder_wei_ ? memory(pd.weights_desc(), CpuEngine()) : user_wei_;  // owned: reordered weights
    if (spec_.bias >= 0) bias_ = memory(b_md, CpuEngine(), nullptr);
  }

  void SetupMatmul(const std::vector<DLTensor*>& t) {
    const DLTensor* x = t[spec_.data];
    const DLTensor* w = t[spec_.weight];
    const DLTensor* y = t.back();
    if (x->ndim < 2 || w->ndim != 2 || y->ndim != x->ndim) {
      TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name
                                << "': matmul needs data of rank 2-5 and a 2-D weight";
    }
    // Data of higher rank is contiguous, so it is read as rows x K (and written as rows x N).
    int64_t k = x->shape[x->ndim - 1], n = y->shape[y->ndim - 1], rows = 1;
    for (int d = 0; d + 1 < x->ndim; ++d) rows *= x->shape[d];
    memory::desc src_md({rows, k}, dt::f32, tag::ab), dst_md({rows, n}, dt::f32, tag::ab);
    memory::desc w_md({k, n}, dt::f32, spec_.weight_transposed ? tag::ba : tag::ab);
    memory::desc b_md = spec_.bias >= 0 ? memory::desc({1, n}, dt::f32, tag::ab) : memory::desc();
    dnnl::matmul::desc desc(src_md, w_md, b_md, dst_md);
    dnnl::matmul::primitive_desc pd(desc, PostOps(spec_.residual >= 0), CpuEngine());
    prim_ = dnnl::matmul(pd);
    user_src_ = src_ = memory(src_md, CpuEngine(), nullptr);
    user_dst_ = dst_ = memory(dst_md, CpuEngine(), nullptr);
    user_wei_ = wei_ = memory(w_md, CpuEngine(), nullptr);
    if (spec_.bias >= 0) bias_ = memory(b_md, CpuEngine(), nullptr);
  }

  void SetupPool(const std::vector<DLTensor*>& t) {
    const DLTensor* x = t[spec_.data];
    const DLTensor* y = t.back();
    // Blocked layouts: oneDNN's jit pooling needs them (its plain-NCHW pooling is ~30x slower).
    memory::desc src_md(Dims(x), dt::f32, tag::nChw8c), dst_md(Dims(y), dt::f32, tag::any);
    memory::dims kernel(spec_.pool_size.begin(), spec_.pool_size.end());
    memory::dims strides(spec_.strides.begin(), spec_.strides.end());
    memory::dims dilation;
    for (int64_t d : spec_.dilation) dilation.push_back(d - 1);
    memory::dims pad_l{spec_.padding[0], spec_.padding[1]}, pad_r{spec_.padding[2], spec_.padding[3]};
    dnnl::algorithm alg = spec_.op == "max_pool2d"    ? dnnl::algorithm::pooling_max
                          : spec_.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                                    : dnnl::algorithm::pooling_avg_exclude_padding;
    dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, alg, src_md, dst_md, strides, kernel,
                                        dilation, pad_l, pad_r);
    dnnl::pooling_v2_forward::primitive_desc pd(desc, PostOps(false), CpuEngine());
    prim_ = dnnl::pooling_v2_forward(pd);
    user_src_ = memory(memory::desc(Dims(x), dt::f32, tag::nchw), CpuEngine(), nullptr);
    user_dst_ = memory(memory::desc(Dims(y), dt::f32, tag::nchw), CpuEngine(), nullptr);
    src_ = Reordered(pd.src_desc(), user_src_, &reorder_src_);
    dst_ = Reordered(pd.dst_desc(), user_dst_, &reorder_dst_);
  }

  /*!
   * \brief Channel shuffle (reshape to (N, g, C/g, H, W), swap g and C/g, reshape back) as one
   *        reorder: the source viewed as (N, g, C/g, H, W), the destination as the same dims with
   *        the strides of (N, C/g, g, H, W).
   */
  void SetupChannelShuffle(const std::vector<DLTensor*>& t) {
    const DLTensor* x = t[spec_.data];
    const DLTensor* y = t.back();
    int64_t g = spec_.groups;
    if (x->ndim != 4 || y->ndim != 4 || g < 1 || x->shape[1] % g != 0) {
      TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "': channel_shuffle needs NCHW tensors "
                                << "whose channels divide into " << g << " groups";
    }
    int64_t n = x->shape[0], c = x->shape[1], h = x->shape[2], w = x->shape[3];
    memory::dims dims{n, g, c / g, h, w};
    memory::desc src_md(dims, dt::f32, tag::abcde);
    memory::desc dst_md(dims, dt::f32, memory::dims{c * h * w, h * w, g * h * w, w, 1});
    user_src_ = src_ = memory(src_md, CpuEngine(), nullptr);
    user_dst_ = dst_ = memory(dst_md, CpuEngine(), nullptr);
    prim_ = dnnl::reorder(src_, dst_);
  }

  /*! \brief Softmax along spec_.axis of a plain (row-major) tensor of rank 1-5. */
  void SetupSoftmax(const std::vector<DLTensor*>& t) {
    const DLTensor* x = t[spec_.data];
    if (x->ndim < 1 || x->ndim > 5 || spec_.axis < 0 || spec_.axis >= x->ndim) {
      TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "': softmax needs a 1-5-D tensor and an "
                                << "axis inside it, got rank " << x->ndim << " and axis " << spec_.axis;
    }
    static const tag kPlain[] = {tag::a, tag::ab, tag::abc, tag::abcd, tag::abcde};
    memory::desc md(Dims(x), dt::f32, kPlain[x->ndim - 1]);
    dnnl::softmax_forward::desc desc(dnnl::prop_kind::forward_inference, md, static_cast<int>(spec_.axis));
    prim_ = dnnl::softmax_forward(dnnl::softmax_forward::primitive_desc(desc, CpuEngine()));
    user_src_ = src_ = memory(md, CpuEngine(), nullptr);
    user_dst_ = dst_ = memory(md, CpuEngine(), nullptr);
  }

  /*! \brief Layer norm over the last axis of a plain tensor of rank 2-5, with scale and shift. */
  void SetupLayerNorm(const std::vector<DLTensor*>& t) {
    const DLTensor* x = t[spec_.data];
    if (x->ndim < 2 || x->ndim > 5 || spec_.weight < 0 || spec_.bias < 0) {
      TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "': layer_norm needs a 2-5-D tensor, "
                                << "a scale and a shift";
    }
    int64_t channels = x->shape[x->ndim - 1];
    for (int role : {spec_.weight, spec_.bias}) {
      const DLTensor* v = t[role];
      int64_t size = 1;
      for (int d = 0; d < v->ndim; ++d) size *= v->shape[d];
      if (size != channels) {
        TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "': layer_norm argument " << role
                                  << " has " << size << " elements, the last axis " << channels;
      }
    }
    static const tag kPlain[] = {tag::a, tag::ab, tag::abc, tag::abcd, tag::abcde};
    memory::desc md(Dims(x), dt::f32, kPlain[x->ndim - 1]);
    memory::desc vec({channels}, dt::f32, tag::a);
    auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
    dnnl::layer_normalization_forward::desc desc(dnnl::prop_kind::forward_inference, md, spec_.epsilon, flags);
    prim_ = dnnl::layer_normalization_forward(dnnl::layer_normalization_forward::primitive_desc(desc, CpuEngine()));
    user_src_ = src_ = memory(md, CpuEngine(), nullptr);
    user_dst_ = dst_ = memory(md, CpuEngine(), nullptr);
    user_wei_ = wei_ = memory(vec, CpuEngine(), nullptr);
    bias_ = memory(vec, CpuEngine(), nullptr);
  }

  /*! \brief The argument maps and reorders of every call, bound to the memories above. */
  void SetupArguments() {
    margs_ = {{DNNL_ARG_SRC, src_}, {DNNL_ARG_DST, dst_}};
    if (spec_.weight >= 0) margs_[DNNL_ARG_WEIGHTS] = wei_;
    if (spec_.bias >= 0) margs_[DNNL_ARG_BIAS] = bias_;
    if (spec_.op == "layer_norm") {  // the same memories under layer norm's argument names
      margs_.erase(DNNL_ARG_WEIGHTS);
      margs_.erase(DNNL_ARG_BIAS);
      margs_[DNNL_ARG_SCALE] = wei_;
      margs_[DNNL_ARG_SHIFT] = bias_;
    }
    if (reorder_src_) src_in_ = PreparedReorder(user_src_, src_);
    if (reorder_dst_) dst_out_ = PreparedReorder(dst_, user_dst_);
    if (reorder_wei_) wei_in_ = PreparedReorder(user_wei_, wei_);
    if (spec_.residual >= 0) {
      user_res_ = memory(user_dst_.get_desc(), CpuEngine(), nullptr);
      if (reorder_dst_) res_in_ = PreparedReorder(user_res_, dst_);
    }
    src_bytes_ = reorder_src_ ? src_.get_desc().get_size() : 0;
    dst_bytes_ = reorder_dst_ ? dst_.get_desc().get_size() : 0;
  }

  void Execute(const ffi::PackedArgs& args) {
    dnnl::stream& s = stream_;
    DLTensor* out = Arg(args, spec_.num_inputs);
    user_src_.set_data_handle(Arg(args, spec_.data)->data);
    user_dst_.set_data_handle(out->data);
    if (reorder_src_) {
      src_.set_data_handle(src_scratch.Get(src_bytes_));
      src_in_.Run(s);
    }
    if (reorder_dst_) dst_.set_data_handle(dst_scratch.Get(dst_bytes_));
    if (spec_.weight >= 0) {
      void* w = Arg(args, spec_.weight)->data;
      user_wei_.set_data_handle(w);
      uint64_t generation = weights_generation_->load(std::memory_order_acquire);
      if (reorder_wei_ && (w != weights_source_ || generation != weights_seen_)) {
        wei_in_.Run(s);  // new weights (first call, new address, or parameters set): reorder once
        weights_source_ = w;
        weights_seen_ = generation;
      }
    }
    if (spec_.bias >= 0) bias_.set_data_handle(Arg(args, spec_.bias)->data);
    if (spec_.residual >= 0) {  // the sum post-op adds what dst holds before the call
      void* residual = Arg(args, spec_.residual)->data;
      if (reorder_dst_) {
        user_res_.set_data_handle(residual);
        res_in_.Run(s);
      } else if (residual != out->data) {
        std::memcpy(out->data, residual, user_dst_.get_desc().get_size());
      }
    }
    prim_.execute(s, margs_);
    if (reorder_dst_) dst_out_.Run(s);
    s.wait();
  }

  /*! \brief What the compiler wrote. */
  RegionSpec spec_;
  /*! \brief The module's parameter generation (see DnnlRegionModule). */
  std::shared_ptr<std::atomic<uint64_t>> weights_generation_;
  /*! \brief Whether Setup has run. */
  bool ready_ = false;
  /*! \brief The region's stream on the CPU engine. */
  dnnl::stream stream_{CpuEngine()};
  /*! \brief The primitive (convolution, matmul or pooling). */
  dnnl::primitive prim_;
  /*! \brief Memories in the graph's plain layout, pointed at the arguments on every call. */
  memory user_src_, user_dst_, user_wei_, user_res_;
  /*! \brief Memories in the primitive's layout (the user's when no reorder is needed): src and dst
   *         point at per-thread scratch, weights own their reordered copy; and the bias. */
  memory src_, dst_, wei_, bias_;
  /*! \brief Whether source, destination and weights go through a reorder. */
  bool reorder_src_ = false, reorder_dst_ = false, reorder_wei_ = false;
  /*! \brief Scratch bytes of the reordered source and destination. */
  size_t src_bytes_ = 0, dst_bytes_ = 0;
  /*! \brief The primitive's arguments, bound once. */
  std::unordered_map<int, memory> margs_;
  /*! \brief Reorders into and out of the primitive's layouts, bound once. */
  PreparedReorder src_in_, dst_out_, wei_in_, res_in_;
  /*! \brief Address and parameter generation of the weights now in wei_. */
  void* weights_source_ = nullptr;
  uint64_t weights_seen_ = 0;
};

namespace {
/*! \brief OpenMP's thread count (libgomp is loaded by libdnnl), or -1. */
int OmpMaxThreads() {
  using Fn = int (*)();
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  return fn ? fn() : -1;
}

void OmpSetNumThreads(int n) {
  using Fn = void (*)(int);
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (fn) fn(n);
}

std::string Info() {
  const dnnl_version_t* v = dnnl_version();
  std::ostringstream os;
  os << "{\"available\": true, \"version\": \"" << v->major << "." << v->minor << "." << v->patch
     << "\", \"cpu_runtime\": \"" << (v->cpu_runtime == DNNL_RUNTIME_OMP ? "OMP" : "other")
     << "\", \"threads\": " << OmpMaxThreads() << "}";
  return os.str();
}
}  // namespace

#else  // no oneDNN

bool DnnlAvailable() { return false; }

class RegionExec {
 public:
  RegionExec(RegionSpec spec, std::shared_ptr<std::atomic<uint64_t>>) : spec_(std::move(spec)) {}
  void Run(ffi::PackedArgs) {
    TVM_FFI_THROW(RuntimeError) << "oneDNN region '" << spec_.name
                                << "': libtvm_hetero was built without oneDNN (install libdnnl-dev and rebuild)";
  }

 private:
  RegionSpec spec_;
};

namespace {
void OmpSetNumThreads(int) {}
std::string Info() { return "{\"available\": false}"; }
}  // namespace

#endif  // TVM_HETERO_WITH_ONEDNN

DnnlRegionModule::DnnlRegionModule(std::string json_text) : json_text_(std::move(json_text)) {
  for (RegionSpec& spec : ParseRegions(json_text_)) {
    std::string name = spec.name;
    regions_[name] = std::move(spec);
  }
}

DnnlRegionModule::~DnnlRegionModule() = default;

ffi::Optional<ffi::Function> DnnlRegionModule::GetFunction(const ffi::String& name) {
  if (name == kInvalidateCachesFunction) {
    std::shared_ptr<std::atomic<uint64_t>> generation = weights_generation_;
    return ffi::Function::FromTyped([generation]() { generation->fetch_add(1, std::memory_order_release); });
  }
  auto it = regions_.find(std::string(name));
  if (it == regions_.end()) return std::nullopt;
  // A fresh executor per request: each call site owns its memories and reordered weights.
  auto region = std::make_shared<RegionExec>(it->second, weights_generation_);
  return ffi::Function::FromPacked([region](ffi::PackedArgs args, ffi::Any*) { region->Run(args); });
}

ffi::Bytes DnnlRegionModule::SaveToBytes() const { return ffi::Bytes(json_text_); }

ffi::Module CreateDnnlRegionModule(const std::string& json_text) {
  return ffi::Module(ffi::make_object<DnnlRegionModule>(json_text));
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def("tvm_hetero.dnnl.create_module", [](ffi::String json_text) { return CreateDnnlRegionModule(json_text); })
      .def("ffi.Module.load_from_bytes.tvm_hetero_dnnl",
           [](ffi::Bytes bytes) { return CreateDnnlRegionModule(std::string(bytes)); })
      .def("tvm_hetero.dnnl.available", []() { return DnnlAvailable(); })
      .def("tvm_hetero.dnnl.info", []() { return ffi::String(Info()); })
      .def("tvm_hetero.dnnl.set_num_threads", [](int n) { OmpSetNumThreads(n); });
}

}  // namespace dnnl_backend
}  // namespace tvm_hetero

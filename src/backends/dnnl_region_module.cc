/*!
 * \file dnnl_region_module.cc
 * \brief The oneDNN backend at run time: one primitive (plus post-ops) per region, created on the
 *        region's first call; the module serializes to the compiler's JSON document.
 *
 * Life cycle of a region, like the graph runtime's: the first call checks the arguments and
 * creates the primitive, the memory objects and the reorders; every later call only points the
 * memories at the arguments' data and executes. Weights are reordered into the primitive's
 * preferred layout once and kept while the weight tensor's address stays the same: weights are
 * graph parameters, loaded before the first run (docs/byoc.md).
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

#include <cstring>
#include <mutex>
#include <sstream>

#ifdef TVM_HETERO_WITH_ONEDNN
#include <dlfcn.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace tvm_hetero {
namespace dnnl_backend {

namespace ffi = tvm::ffi;
namespace json = tvm::ffi::json;

namespace {

std::vector<int64_t> IntList(const json::Object& obj, const char* key) {
  std::vector<int64_t> out;
  auto it = obj.find(ffi::String(key));
  if (it == obj.end()) return out;
  for (const ffi::Any& v : (*it).second.cast<json::Array>()) out.push_back(v.cast<int64_t>());
  return out;
}

int64_t IntOr(const json::Object& obj, const char* key, int64_t fallback) {
  auto it = obj.find(ffi::String(key));
  return it == obj.end() ? fallback : (*it).second.cast<int64_t>();
}

bool BoolOr(const json::Object& obj, const char* key, bool fallback) {
  auto it = obj.find(ffi::String(key));
  return it == obj.end() ? fallback : (*it).second.cast<bool>();
}

}  // namespace

std::vector<RegionSpec> ParseRegions(const std::string& json_text) {
  ffi::String error;
  json::Value root = json::Parse(ffi::String(json_text), &error);
  if (!error.empty()) TVM_FFI_THROW(ValueError) << "oneDNN regions: invalid JSON: " << error;
  auto top = root.try_cast<json::Object>();
  if (!top) TVM_FFI_THROW(ValueError) << "oneDNN regions: expected an object";
  std::vector<RegionSpec> out;
  for (const ffi::Any& item : (*top)[ffi::String("regions")].cast<json::Array>()) {
    json::Object obj = item.cast<json::Object>();
    RegionSpec r;
    r.name = std::string(obj[ffi::String("name")].cast<ffi::String>());
    r.op = std::string(obj[ffi::String("op")].cast<ffi::String>());
    r.num_inputs = static_cast<int>(IntOr(obj, "num_inputs", 1));
    r.data = static_cast<int>(IntOr(obj, "data", 0));
    r.weight = static_cast<int>(IntOr(obj, "weight", -1));
    r.bias = static_cast<int>(IntOr(obj, "bias", -1));
    r.residual = static_cast<int>(IntOr(obj, "residual", -1));
    r.relu = BoolOr(obj, "relu", false);
    r.weight_transposed = BoolOr(obj, "weight_transposed", false);
    r.count_include_pad = BoolOr(obj, "count_include_pad", false);
    r.strides = IntList(obj, "strides");
    r.padding = IntList(obj, "padding");
    r.dilation = IntList(obj, "dilation");
    r.pool_size = IntList(obj, "pool_size");
    r.groups = IntOr(obj, "groups", 1);
    for (int role : {r.data, r.weight, r.bias, r.residual}) {
      if (role >= r.num_inputs) {
        TVM_FFI_THROW(ValueError) << "oneDNN region '" << r.name << "': argument " << role << " of "
                                  << r.num_inputs;
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

/*! \brief A region ready to run: primitive, memories and reorders, made on the first call. */
class RegionExec {
 public:
  explicit RegionExec(RegionSpec spec) : spec_(std::move(spec)) {}

  /*! \brief Run with the call's tensors: inputs, then the output. */
  void Run(ffi::PackedArgs args) {
    std::lock_guard<std::mutex> lock(mutex_);  // the scratch memories belong to the region
    if (args.size() != spec_.num_inputs + 1) {
      TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "' takes " << spec_.num_inputs
                                << " inputs and 1 output, got " << args.size() << " arguments";
    }
    std::vector<DLTensor*> t;
    for (int i = 0; i < args.size(); ++i) t.push_back(args[i].cast<DLTensor*>());
    if (!ready_) Setup(t);
    Execute(t);
  }

 private:
  void Check(const std::vector<DLTensor*>& t) const {
    for (size_t i = 0; i < t.size(); ++i) {
      const DLTensor* x = t[i];
      bool f32 = x->dtype.code == kDLFloat && x->dtype.bits == 32 && x->dtype.lanes == 1;
      if (!f32 || x->device.device_type != kDLCPU || x->byte_offset != 0) {
        TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "': argument " << i
                                  << " must be a float32 CPU tensor without byte offset";
      }
    }
  }

  void Setup(const std::vector<DLTensor*>& t) {
    Check(t);
    try {
      if (spec_.op == "conv2d") {
        SetupConv(t);
      } else if (spec_.op == "matmul") {
        SetupMatmul(t);
      } else if (spec_.op == "max_pool2d" || spec_.op == "avg_pool2d") {
        SetupPool(t);
      } else {
        TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "': unknown op '" << spec_.op << "'";
      }
    } catch (const dnnl::error& e) {
      TVM_FFI_THROW(RuntimeError) << "oneDNN region '" << spec_.name << "' (" << spec_.op
                                  << "): cannot create the primitive: " << e.what();
    }
    ready_ = true;
  }

  /*! \brief A memory in `want`'s layout, and whether it differs from the user's (needs a reorder). */
  static memory Reordered(const memory::desc& want, const memory& user, bool* differs) {
    *differs = want != user.get_desc();
    return *differs ? memory(want, CpuEngine()) : user;
  }

  dnnl::primitive_attr PostOps(bool sum) const {
    dnnl::post_ops ops;
    if (sum) ops.append_sum(1.f);
    if (spec_.relu) ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    return attr;
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
    wei_desc_ = pd.weights_desc();
    reorder_wei_ = wei_desc_ != user_wei_.get_desc();
    if (spec_.bias >= 0) bias_ = memory(b_md, CpuEngine(), nullptr);
  }

  void SetupMatmul(const std::vector<DLTensor*>& t) {
    const DLTensor* x = t[spec_.data];
    const DLTensor* w = t[spec_.weight];
    const DLTensor* y = t.back();
    if (x->ndim != 2 || w->ndim != 2 || y->ndim != 2) {
      TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "': matmul needs 2-D tensors";
    }
    int64_t k = x->shape[1], n = y->shape[1];
    memory::desc src_md(Dims(x), dt::f32, tag::ab), dst_md(Dims(y), dt::f32, tag::ab);
    memory::desc w_md({k, n}, dt::f32, spec_.weight_transposed ? tag::ba : tag::ab);
    memory::desc b_md = spec_.bias >= 0 ? memory::desc({1, n}, dt::f32, tag::ab) : memory::desc();
    dnnl::matmul::desc desc(src_md, w_md, b_md, dst_md);
    dnnl::matmul::primitive_desc pd(desc, PostOps(spec_.residual >= 0), CpuEngine());
    prim_ = dnnl::matmul(pd);
    user_src_ = src_ = memory(src_md, CpuEngine(), nullptr);
    user_dst_ = dst_ = memory(dst_md, CpuEngine(), nullptr);
    user_wei_ = memory(w_md, CpuEngine(), nullptr);
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

  void Execute(const std::vector<DLTensor*>& t) {
    dnnl::stream& s = stream_;
    user_src_.set_data_handle(t[spec_.data]->data);
    user_dst_.set_data_handle(t.back()->data);
    if (reorder_src_) dnnl::reorder(user_src_, src_).execute(s, user_src_, src_);
    std::unordered_map<int, memory> margs{{DNNL_ARG_SRC, src_}, {DNNL_ARG_DST, dst_}};
    if (spec_.weight >= 0) {
      void* w = t[spec_.weight]->data;
      user_wei_.set_data_handle(w);
      margs[DNNL_ARG_WEIGHTS] = reorder_wei_ ? ReorderedWeights(w) : user_wei_;
    }
    if (spec_.bias >= 0) {
      bias_.set_data_handle(t[spec_.bias]->data);
      margs[DNNL_ARG_BIAS] = bias_;
    }
    if (spec_.residual >= 0) {  // the sum post-op adds what dst holds before the call
      memory residual(user_dst_.get_desc(), CpuEngine(), t[spec_.residual]->data);
      if (reorder_dst_) {
        dnnl::reorder(residual, dst_).execute(s, residual, dst_);
      } else if (t[spec_.residual]->data != t.back()->data) {
        std::memcpy(t.back()->data, t[spec_.residual]->data, user_dst_.get_desc().get_size());
      }
    }
    prim_.execute(s, margs);
    if (reorder_dst_) dnnl::reorder(dst_, user_dst_).execute(s, dst_, user_dst_);
    s.wait();
  }


 public:
  /*! \brief Drop reordered weights: the graph's weights changed (params loaded, new runtime). */
  void ForgetWeights() {
    std::lock_guard<std::mutex> lock(mutex_);
    weights_.clear();
  }

 private:
  /*! \brief The weights at `w` in the primitive's layout, reordered on first sight. */
  memory ReorderedWeights(void* w) {
    auto it = weights_.find(w);
    if (it != weights_.end()) return it->second;
    memory reordered(wei_desc_, CpuEngine());
    dnnl::reorder(user_wei_, reordered).execute(stream_, user_wei_, reordered);
    return weights_[w] = reordered;
  }

  /*! \brief What the compiler wrote. */
  RegionSpec spec_;
  /*! \brief Guards the lazily made state and the scratch memories. */
  std::mutex mutex_;
  /*! \brief Whether Setup has run. */
  bool ready_ = false;
  /*! \brief The region's stream on the CPU engine. */
  dnnl::stream stream_{CpuEngine()};
  /*! \brief The primitive (convolution, matmul or pooling). */
  dnnl::primitive prim_;
  /*! \brief Memories in the graph's plain layout, pointed at the arguments on every call. */
  memory user_src_, user_dst_, user_wei_;
  /*! \brief Memories in the primitive's layout (the user's when no reorder is needed), and the bias. */
  memory src_, dst_, bias_;
  /*! \brief Whether source, destination and weights go through a reorder. */
  bool reorder_src_ = false, reorder_dst_ = false, reorder_wei_ = false;
  /*! \brief Layout the primitive wants its weights in. */
  memory::desc wei_desc_;
  /*! \brief Reordered weights by the address of the graph's weights: identical regions share one
   *         function (FuseOpsByPattern deduplicates them), each call site with its own weights. */
  std::unordered_map<void*, memory> weights_;
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
  explicit RegionExec(RegionSpec spec) : spec_(std::move(spec)) {}
  void ForgetWeights() {}
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
    regions_[name] = std::make_shared<RegionExec>(std::move(spec));
  }
}

DnnlRegionModule::~DnnlRegionModule() = default;

ffi::Optional<ffi::Function> DnnlRegionModule::GetFunction(const ffi::String& name) {
  if (name == kInvalidateCachesFunction) {
    ffi::ObjectPtr<ffi::Object> self = ffi::GetObjectPtr<ffi::Object>(static_cast<ffi::Object*>(this));
    return ffi::Function::FromTyped([self, this]() {
      for (auto& [region_name, region] : regions_) region->ForgetWeights();
    });
  }
  auto it = regions_.find(std::string(name));
  if (it == regions_.end()) return std::nullopt;
  // The closure holds the module so the region outlives the module handle.
  ffi::ObjectPtr<ffi::Object> self = ffi::GetObjectPtr<ffi::Object>(static_cast<ffi::Object*>(this));
  std::shared_ptr<RegionExec> region = it->second;
  return ffi::Function::FromPacked([self, region](ffi::PackedArgs args, ffi::Any*) { region->Run(args); });
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

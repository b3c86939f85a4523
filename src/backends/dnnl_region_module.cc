/*!
 * \file dnnl_region_module.cc
 * \brief The oneDNN backend at run time: each region call site runs the region's steps (oneDNN
 *        primitives with post-ops) as a prepared list of primitive calls, created on its first
 *        call; the module serializes to the compiler's JSON document (parsed in dnnl_region_spec.cc).
 *
 * Life cycle of a call site, like the graph runtime's: the first call checks the arguments, creates
 * every primitive, reorder and argument map, and plans one arena for the values passed between
 * steps (kept in the layouts the primitives chose, so a chain of convolutions stays blocked and is
 * reordered only at the region's edges). Nothing in an arena outlives its call, so every call site
 * of a thread uses that thread's scratch as its arena; each step's primitives also get their
 * scratchpad there (oneDNN's user scratchpad mode, one buffer per step, alive during that step), and
 * each primitive's arguments are packed once into the C API's array. Every later call only points
 * the memories bound to its arguments at their data and executes -- no allocation of ours, no map
 * building, no lock. (oneDNN 2.6's dnnl_primitive_execute still allocates inside itself: it copies
 * the argument array into a hash map on every execution, which its public API cannot avoid;
 * tests/cpp/dnnl_region_allocation_test.cc counts both sides.) Weights are
 * reordered into the primitive's preferred layout once and kept while the weight tensor's address
 * and the module's parameter generation (bumped by the cache-invalidation hook whenever parameters
 * are set) stay the same (docs/byoc.md).
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

#include "backends/int8_matmul.h"
#include "backends/one_row_matmul.h"
#include "support/device.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
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


}  // namespace

namespace {
/*! \brief Bytes of every thread's scratch now allocated in this process (reported by Info()). */
std::atomic<int64_t> scratch_bytes_total{0};

/*!
 * \brief One thread's scratch: every call site's arena, used by one call at a time (nothing in an
 *        arena outlives its call). Grown on a call that needs more (a call site's first calls),
 *        never shrunk before the thread ends, so a steady-state call allocates nothing.
 */
class Scratch {
 public:
  ~Scratch() {
    std::free(data_);
    scratch_bytes_total.fetch_sub(static_cast<int64_t>(size_), std::memory_order_relaxed);
  }
  /*! \brief At least `nbytes`, 64-byte aligned; the contents are not kept when it grows. */
  char* Get(size_t nbytes) {
    if (nbytes > size_) {
      std::free(data_);
      scratch_bytes_total.fetch_sub(static_cast<int64_t>(size_), std::memory_order_relaxed);
      size_ = 0;
      data_ = static_cast<char*>(std::aligned_alloc(kAlign, (nbytes + kAlign - 1) / kAlign * kAlign));
      if (data_ == nullptr) TVM_FFI_THROW(RuntimeError) << "oneDNN region: out of memory for scratch";
      size_ = (nbytes + kAlign - 1) / kAlign * kAlign;
      scratch_bytes_total.fetch_add(static_cast<int64_t>(size_), std::memory_order_relaxed);
    }
    return data_;
  }
  static constexpr size_t kAlign = 64;

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};
thread_local Scratch scratch;

/*! \brief The plain (row-major) layout of `dims`, rank 1-5. */
memory::desc Plain(const memory::dims& dims, dt type = dt::f32) {
  static const tag kPlain[] = {tag::a, tag::ab, tag::abc, tag::abcd, tag::abcde};
  if (dims.empty() || dims.size() > 5) {
    TVM_FFI_THROW(ValueError) << "oneDNN region: tensors of rank 1-5 only, got rank " << dims.size();
  }
  return memory::desc(dims, type, kPlain[dims.size() - 1]);
}

bool IsPlain(const memory::desc& md) { return md == Plain(md.dims(), md.data_type()); }

/*! \brief `md`'s layout holding another data type (a quantized value and its float twin). */
memory::desc WithType(const memory::desc& md, dt type) {
  dnnl_memory_desc_t d = md.data;
  d.data_type = static_cast<dnnl_data_type_t>(type);
  d.extra = dnnl_memory_extra_desc_t{};
  return memory::desc(d);
}

/*! \brief The oneDNN type of a call argument: float32, uint8, int8 or int32 (-1: none of them). */
dt TypeOf(const DLTensor* x) {
  if (x->dtype.lanes != 1) return dt::undef;
  if (x->dtype.code == kDLFloat && x->dtype.bits == 32) return dt::f32;
  if (x->dtype.code == kDLUInt && x->dtype.bits == 8) return dt::u8;
  if (x->dtype.code == kDLInt && x->dtype.bits == 8) return dt::s8;
  if (x->dtype.code == kDLInt && x->dtype.bits == 32) return dt::s32;
  return dt::undef;
}

/*! \brief The document's name of a quantized type. */
dt QuantType(const std::string& name) { return name == "u8" ? dt::u8 : name == "s8" ? dt::s8 : dt::f32; }

int64_t Elements(const memory::dims& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}
}  // namespace

/*!
 * \brief Weights reordered into a primitive's layout, shared by every call site that reads the same
 *        weights the same way (the frames of one runtime each have their own call sites of a region,
 *        and read the runtime's one copy of the parameters).
 *
 * Guarantee: a buffer is (re)ordered by one call site at a time, under `mu`, and only when the
 * weights are new to that call site (its first call, a new address, parameters set); a call site
 * whose weights are current reads it without a lock. Parameters are not set while frames run
 * (docs/runtime.md), so nothing writes a buffer another call is reading.
 */
/*! \brief Weight reorders executed in this process (first calls, parameters set): what tests count. */
std::atomic<uint64_t> g_weight_reorders{0};

struct SharedWeight {
  memory::desc desc;
  std::shared_ptr<void> buffer;
  std::mutex mu;
  /*! \brief What the buffer holds (under `mu`): the source address and parameter generation. */
  bool filled = false;
  void* seen = nullptr;
  uint64_t generation = 0;
};

/*! \brief The module's shared weights, by call-site key (region, step, argument, source address). */
class WeightCache {
 public:
  /*! \brief The entry for `key` in layout `want`; null when the key holds another layout (then the
   *         call site keeps a buffer of its own). */
  std::shared_ptr<SharedWeight> Get(const std::string& key, const memory::desc& want) {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<SharedWeight>& entry = entries_[key];
    if (!entry) {
      auto made = std::make_shared<SharedWeight>();
      size_t bytes = std::max<size_t>((want.get_size() + 63) / 64 * 64, 64);
      void* data = std::aligned_alloc(64, bytes);
      if (data == nullptr) throw std::bad_alloc();
      made->buffer = std::shared_ptr<void>(data, std::free);
      made->desc = want;
      entry = std::move(made);
    }
    return entry->desc == want ? entry : nullptr;
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<SharedWeight>> entries_;
};

/*!
 * \brief One call site of a region: the steps' primitives, the reorders at the region's edges, and
 *        the plan of its arena (every value passed between steps), made on the first call.
 *        Every later call points the memories bound to call arguments at them and runs a flat list
 *        of prepared primitive calls.
 *
 * Layouts: each step's primitive picks its layouts (`any`) given what it reads; a value is
 * reordered only when its reader wants another layout (a plain-layout reader of a blocked value,
 * the call's inputs into a blocked convolution, the last value out to the call's plain output).
 * Arena: each internal value lives from the step that makes it to its last reader; buffers whose
 * lifetimes overlap never share bytes (placed greedily by size, then checked).
 */
class RegionExec {
 public:
  RegionExec(RegionSpec spec, std::shared_ptr<std::atomic<uint64_t>> weights_generation,
             std::shared_ptr<WeightCache> weight_cache)
      : spec_(std::move(spec)),
        weights_generation_(std::move(weights_generation)),
        weight_cache_(std::move(weight_cache)) {}

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
  /*! \brief A value of the region (a call input or a step's output) as stored. */
  struct Value {
    /*! \brief Its layout (dims are the value's own shape). */
    memory::desc desc;
    /*! \brief Its memory, in `desc`. */
    memory mem;
    /*! \brief Call argument it is (-1: it lives in the arena, buffer `buffer`). */
    int arg = -1, buffer = -1;
    /*! \brief The last step reading it (the number of steps: read after the last step). */
    int last_use = -1;
  };
  /*! \brief A byte range of the arena, needed from step `first` to step `last`. */
  struct Buffer {
    size_t bytes = 0, offset = 0;
    int first = 0, last = 0;
  };
  /*! \brief One prepared call: a primitive with its arguments, a weight reorder (run only when the
   *         weights changed), or a copy between two call arguments (skipped when they coincide). */
  struct Call {
    dnnl::primitive prim;
    /*! \brief Its arguments by role (built at setup; owns the memories `exec_args` names). */
    std::unordered_map<int, memory> args;
    /*! \brief `args` as oneDNN's C API takes them, built once at setup (PackArguments). */
    std::vector<dnnl_exec_arg_t> exec_args;
    /*! \brief Weight reorder: the call argument holding the weights; its address and the parameter
     *         generation of the weights now reordered. */
    int weight_arg = -1;
    void* weight_seen = nullptr;
    uint64_t generation_seen = 0;
    /*! \brief The shared buffer it reorders into (null: one of its own). */
    std::shared_ptr<SharedWeight> shared;
    /*! \brief Copy: from and to call arguments, and how many bytes. */
    int copy_from = -1, copy_to = -1;
    size_t copy_bytes = 0;
    /*! \brief Made for (and run on) one thread: its step is too small to pay a fork and join. */
    bool single = false;
    /*! \brief A matmul our own kernels run: its index in `own_steps_` (-1: not one). */
    int own = -1;
  };
  /*! \brief A matmul step our own kernels run (backends/int8_matmul.h, one_row_matmul.h), as
   *         prepared: the call arguments holding its weight, scales, zero point (uint8, one) and
   *         bias (-1: none), its sizes, and the memories of its input, output and scratch (arena). */
  struct OwnStep {
    /*! \brief True: 8-bit weights (N, K); false: one float32 row against float32 weights, (K, N) or
     *         in panels (`panels`). */
    bool int8 = true;
    bool panels = false;
    int weight = -1, scale = -1, zero_point = -1, bias = -1;
    int64_t rows = 0, out = 0, in = 0;
    memory src, dst, scratch;
  };

  /*!
   * \brief Below this much work (multiply-adds of a conv / matmul, elements of anything else) a
   *        step runs on one thread: waking an OpenMP team (passive waiting, a shared machine) costs
   *        tens of microseconds, more than such a step computes (MobileNetV2 at 96x96, a small
   *        BERT: most of their steps).
   */
  static constexpr double kParallelWork = 2e6;

  /*! \brief OpenMP's thread count for what the calling thread starts next (libgomp is loaded by
   *         libdnnl; 1 without it). oneDNN reads it when a primitive is made and when it runs. */
  static int OmpThreads() {
    static auto fn = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    return fn ? fn() : 1;
  }
  static void SetOmpThreads(int n) {
    static auto fn = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    if (fn) fn(n);
  }

  /*! \brief The calling thread's OpenMP count is 1 while it lives (when `on`), `restore` after. */
  struct OneThreadWhile {
    OneThreadWhile(bool on, int restore) : on(on), restore(restore) {
      if (on) SetOmpThreads(1);
    }
    ~OneThreadWhile() {
      if (on) SetOmpThreads(restore);
    }
    bool on;
    int restore;
  };

  /*! \brief Step k's work (see kParallelWork), from the shapes the call and the document give. */
  double StepWork(size_t k, const std::vector<DLTensor*>& t) const {
    const StepSpec& s = spec_.steps[k];
    double out = static_cast<double>(Elements(OutputDims(k, t)));
    auto dims_of = [&](int v) {
      if (v < spec_.num_inputs) return memory::dims(t[v]->shape, t[v]->shape + t[v]->ndim);
      return OutputDims(static_cast<size_t>(v - spec_.num_inputs), t);
    };
    if (s.op == "conv2d" && s.weight >= 0) return out * static_cast<double>(Elements(dims_of(s.weight)) / dims_of(s.weight)[0]);
    if ((s.op == "matmul" || s.op == "int8_weight_matmul") && s.data >= 0) {
      return out * static_cast<double>(dims_of(s.data).back());
    }
    if (s.op == "batch_matmul") return out * static_cast<double>(dims_of(s.inputs[0]).back());
    return out;
  }

  static DLTensor* Arg(const ffi::PackedArgs& args, int i) { return args[i].cast<DLTensor*>(); }

  [[noreturn]] void Fail(size_t step, const std::string& what) const {
    TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "' step " << step << " ("
                              << spec_.steps[step].op << "): " << what;
  }

  void Check(const ffi::PackedArgs& args) const {
    for (int i = 0; i < args.size(); ++i) {
      const DLTensor* x = Arg(args, i);
      if (TypeOf(x) == dt::undef || !support::IsHost(x->device) || x->byte_offset != 0) {
        TVM_FFI_THROW(ValueError) << "oneDNN region '" << spec_.name << "': argument " << i
                                  << " must be a float32, uint8, int8 or int32 CPU tensor without byte offset";
      }
    }
  }

  void Setup(const ffi::PackedArgs& args) {
    Check(args);
    std::vector<DLTensor*> t;
    for (int i = 0; i < args.size(); ++i) t.push_back(Arg(args, i));
    setup_tensors_ = &t;  // for the keys of shared weights (setup only)
    int n = spec_.num_inputs, steps = static_cast<int>(spec_.steps.size());
    values_.assign(n + steps, Value{});
    for (int i = 0; i < n; ++i) {
      memory::dims dims(t[i]->shape, t[i]->shape + t[i]->ndim);
      values_[i].desc = Plain(dims.empty() ? memory::dims{1} : dims, TypeOf(t[i]));  // a scalar (e.g. hardswish's 3) as one element
      values_[i].arg = i;
      values_[i].mem = Bound(values_[i].desc, i);
    }
    for (int k = 0; k < steps; ++k) {
      const StepSpec& s = spec_.steps[k];
      for (int v : {s.data, s.residual}) {
        if (v >= 0 && s.op != "add") values_[v].last_use = k;
      }
      for (int v : s.inputs) values_[v].last_use = k;
    }
    values_.back().last_use = steps;
    size_t k = 0;
    team_ = OmpThreads();
    try {
      for (k = 0; k < spec_.steps.size(); ++k) {
        size_t first = calls_.size();
        bool single = team_ > 1 && StepWork(k, t) < kParallelWork;
        {
          OneThreadWhile scope(single, team_);  // its primitives are made for one thread (they keep that)
          SetupStep(k, t);
        }
        for (size_t c = first; c < calls_.size(); ++c) calls_[c].single = single;
        PlaceScratchpads(first, static_cast<int>(k));
      }
      const Value& out = values_.back();
      if (out.arg != n) {  // the last value is in the arena: reorder it out to the call's output
        memory user = Bound(Plain(OutputDims(k - 1, t), TypeOf(t[n])), n);
        if (user.get_desc().data_type() != out.desc.data_type()) Fail(k - 1, "the output's data type is not the call's");
        size_t first = calls_.size();
        calls_.push_back(Reorder(out.mem, user));
        PlaceScratchpads(first, static_cast<int>(k));
      }
    } catch (const dnnl::error& e) {
      Fail(std::min(k, spec_.steps.size() - 1), std::string("cannot create the primitive: ") + e.what());
    }
    setup_tensors_ = nullptr;
    PackArguments();
    PlanArena();
    ready_ = true;
  }

  void SetupStep(size_t k, const std::vector<DLTensor*>& t) {
    const std::string& op = spec_.steps[k].op;
    if (op == "conv2d") {
      SetupConv(k, t);
    } else if (op == "matmul") {
      SetupMatmul(k, t);
    } else if (op == "max_pool2d" || op == "avg_pool2d") {
      SetupPool(k, t);
    } else if (op == "channel_shuffle") {
      SetupChannelShuffle(k, t);
    } else if (op == "softmax") {
      SetupSoftmax(k, t);
    } else if (op == "layer_norm") {
      SetupLayerNorm(k, t);
    } else if (op == "batch_matmul") {
      SetupBatchMatmul(k, t);
    } else if (op == "lrn") {
      SetupLrn(k);
    } else if (op == "scale_shift") {
      SetupScaleShift(k);
    } else if (op == "quantize" || op == "dequantize") {
      SetupRequantize(k);
    } else if (op == "add") {
      SetupQuantizedAdd(k);
    } else if (op == "int8_weight_matmul") {
      SetupInt8WeightMatmul(k, t);
    } else {
      SetupConcat(k, t);
    }
  }

  // ---- values and memories ----
  /*! \brief A memory in `md` pointed at call argument `arg` on every call. */
  memory Bound(const memory::desc& md, int arg) {
    memory m(md, CpuEngine(), nullptr);
    bindings_.push_back({m, arg});
    return m;
  }

  /*! \brief A memory in `md` over arena buffer `buffer` (placed once the arena is planned). */
  memory Placed(const memory::desc& md, int buffer) {
    memory m(md, CpuEngine(), nullptr);
    placements_.push_back({m, buffer});
    return m;
  }

  int NewBuffer(size_t bytes, int first, int last) {
    buffers_.push_back(Buffer{bytes, 0, first, last});
    return static_cast<int>(buffers_.size()) - 1;
  }

  /*! \brief A memory in `md` over the same bytes as value `v`. */
  memory Alias(const Value& v, const memory::desc& md) {
    if (md == v.desc) return v.mem;
    return v.arg >= 0 ? Bound(md, v.arg) : Placed(md, v.buffer);
  }

  /*! \brief The dims of step k's output: written by the compiler, or the call output's (last step). */
  memory::dims OutputDims(size_t k, const std::vector<DLTensor*>& t) const {
    const StepSpec& s = spec_.steps[k];
    if (!s.shape.empty()) return memory::dims(s.shape.begin(), s.shape.end());
    const DLTensor* y = t.back();
    return memory::dims(y->shape, y->shape + y->ndim);
  }

  /*!
   * \brief Value `id` as read by step k in layout `want`: the value itself when its layout is
   *        `want`; a view when both are plain with as many elements (a matmul reads (B, T, K) as
   *        (B*T, K)); otherwise a reorder into a buffer needed during step k only.
   */
  memory Input(size_t k, int id, const memory::desc& want) {
    const Value& v = values_[id];
    if (v.desc == want) return v.mem;
    if (v.desc.data_type() != want.data_type()) {
      Fail(k, "value " + std::to_string(id) + " has another data type than the step reads");
    }
    bool same_dims = v.desc.dims() == want.dims();
    if (!same_dims && !(IsPlain(want) && Elements(v.desc.dims()) == Elements(want.dims()))) {
      Fail(k, "value " + std::to_string(id) + " has another shape than the step reads");
    }
    if (!same_dims && IsPlain(v.desc)) return Alias(v, want);
    memory::desc to = same_dims ? want : Plain(v.desc.dims(), want.data_type());
    int buffer = NewBuffer(to.get_size(), static_cast<int>(k), static_cast<int>(k));
    memory tmp = Placed(to, buffer);
    calls_.push_back(Reorder(v.mem, tmp));
    return same_dims ? tmp : Placed(want, buffer);
  }

  /*!
   * \brief Step k's output value, stored in `md` (its dims are the value's): the call's output when
   *        it is the last step and `md` is plain, else an arena buffer alive until its last reader.
   */
  memory Output(size_t k, const memory::desc& md) {
    int id = spec_.num_inputs + static_cast<int>(k);
    Value& v = values_[id];
    v.desc = md;
    if (k + 1 == spec_.steps.size() && IsPlain(md)) {
      v.arg = spec_.num_inputs;
      v.mem = Bound(md, v.arg);
    } else if (int r = InPlaceResidual(k, md); r >= 0) {
      v.buffer = values_[r].buffer;  // the sum post-op adds what dst holds: the residual, already there
      buffers_[v.buffer].last = std::max(v.last_use, static_cast<int>(k));
      v.mem = Placed(md, v.buffer);
    } else {
      v.buffer = NewBuffer(md.get_size(), static_cast<int>(k), std::max(v.last_use, static_cast<int>(k)));
      v.mem = Placed(md, v.buffer);
    }
    return v.mem;
  }

  /*! \brief The residual value step k may write its output over (-1: none): one in the arena, in
   *         the output's layout, read last by this step, and not also the step's data. */
  int InPlaceResidual(size_t k, const memory::desc& md) const {
    const StepSpec& s = spec_.steps[k];
    if (s.residual < 0 || s.residual == s.data) return -1;
    const Value& r = values_[s.residual];
    return r.buffer >= 0 && r.last_use == static_cast<int>(k) && r.desc == md ? s.residual : -1;
  }

  /*! \brief A weight (a call input) in the primitive's layout `want`: reordered into memory this
   *         call site owns when it differs from the stored `user` layout, again only when it changed. */
  memory Weights(size_t k, int id, const memory::desc& user, const memory::desc& want) {
    if (id < 0 || id >= spec_.num_inputs) Fail(k, "weights must be inputs of the region");
    memory from = Bound(user, id);
    if (want == user) return from;
    std::ostringstream key;
    key << spec_.name << '/' << k << '/' << id << '/' << (*setup_tensors_)[id]->data;
    std::shared_ptr<SharedWeight> shared = weight_cache_ ? weight_cache_->Get(key.str(), want) : nullptr;
    memory owned = shared ? memory(want, CpuEngine(), shared->buffer.get()) : memory(want, CpuEngine());
    Call c = Reorder(from, owned);
    c.weight_arg = id;
    c.shared = std::move(shared);
    calls_.push_back(std::move(c));
    return owned;
  }

  /*! \brief A vector argument (bias, scale, shift): a call input read as `md`. */
  memory Vector(size_t k, int id, const memory::desc& md) {
    if (id < 0 || id >= spec_.num_inputs) Fail(k, "bias, scale and shift must be inputs of the region");
    return Bound(md, id);
  }

  /*! \brief Before the step: `dst` (the step's output) gets value `id`, for the sum post-op. */
  void Residual(size_t k, int id, const memory& dst) {
    const Value& v = values_[id];
    const Value& out = values_[spec_.num_inputs + k];
    if (out.buffer >= 0 && out.buffer == v.buffer) return;  // written in place (InPlaceResidual)
    if (v.arg >= 0 && out.arg >= 0 && (IsPlain(dst.get_desc()) || v.desc == out.desc)) {
      Call c;  // both call arguments: the graph may have planned them into the same bytes
      c.copy_from = v.arg;
      c.copy_to = out.arg;
      c.copy_bytes = out.desc.get_size();
      calls_.push_back(std::move(c));
      return;
    }
    memory from = v.desc.dims() == dst.get_desc().dims() ? v.mem : Input(k, id, dst.get_desc());
    calls_.push_back(Reorder(from, dst));
  }

  static Call Reorder(const memory& from, const memory& to) {
    Call c;
    c.prim = dnnl::reorder(dnnl::reorder::primitive_desc(from, to, UserScratchpad()));
    c.args = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    return c;
  }

  /*! \brief Offsets for every buffer (largest first, lowest offset clear of every buffer alive at
   *         the same time), checked; the arena is the calling thread's scratch (PointArena). */
  void PlanArena() {
    constexpr size_t kAlign = Scratch::kAlign;
    std::vector<int> order(buffers_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return buffers_[a].bytes > buffers_[b].bytes; });
    auto live_together = [&](const Buffer& a, const Buffer& b) { return a.first <= b.last && b.first <= a.last; };
    std::vector<int> placed;
    for (int i : order) {
      Buffer& b = buffers_[i];
      b.bytes = (b.bytes + kAlign - 1) / kAlign * kAlign;
      std::vector<std::pair<size_t, size_t>> busy;
      for (int j : placed) {
        if (live_together(b, buffers_[j])) busy.push_back({buffers_[j].offset, buffers_[j].offset + buffers_[j].bytes});
      }
      std::sort(busy.begin(), busy.end());
      size_t offset = 0;
      for (const auto& [lo, hi] : busy) {
        if (offset + b.bytes <= lo) break;
        offset = std::max(offset, hi);
      }
      b.offset = offset;
      arena_bytes_ = std::max(arena_bytes_, offset + b.bytes);
      placed.push_back(i);
    }
    for (size_t a = 0; a < buffers_.size(); ++a) {  // the plan checks itself: cheap, once
      for (size_t b = a + 1; b < buffers_.size(); ++b) {
        const Buffer &x = buffers_[a], &y = buffers_[b];
        if (live_together(x, y) && x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes) {
          TVM_FFI_THROW(InternalError) << "oneDNN region '" << spec_.name << "': arena buffers " << a << " and " << b
                                       << " overlap while both are alive";
        }
      }
    }
    for (auto& [m, buffer] : placements_) offsets_.push_back(buffers_[buffer].offset);
  }

  /*! \brief Point every placed memory into this thread's scratch, when it is not there already. */
  void PointArena() {
    if (arena_bytes_ == 0) return;
    char* base = scratch.Get(arena_bytes_);
    if (base == arena_base_) return;
    for (size_t i = 0; i < placements_.size(); ++i) placements_[i].first.set_data_handle(base + offsets_[i]);
    arena_base_ = base;
  }

  /*! \brief Attributes every primitive starts from: its scratchpad is memory this call site gives it
   *         (placed in the arena, PlaceScratchpads), not the library's, which oneDNN shares between
   *         the primitives one thread created (unless built with DNNL_ENABLE_CONCURRENT_EXEC): unsafe
   *         when call sites set up on one thread run on several at once (frames, pipeline stages). */
  static dnnl::primitive_attr UserScratchpad() {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
  }

  /*!
   * \brief Give every primitive of calls [first, end) (step `step`'s) its scratchpad: one arena
   *        buffer alive during that step only, as large as the largest of theirs (they run one
   *        after another, so they share it).
   */
  void PlaceScratchpads(size_t first, int step) {
    size_t bytes = 0;
    for (size_t c = first; c < calls_.size(); ++c) {
      if (calls_[c].prim) bytes = std::max(bytes, ScratchpadDesc(calls_[c].prim).get_size());
    }
    if (bytes == 0) return;
    int buffer = NewBuffer(bytes, step, step);
    for (size_t c = first; c < calls_.size(); ++c) {
      if (!calls_[c].prim) continue;
      memory::desc md = ScratchpadDesc(calls_[c].prim);
      if (md.get_size() > 0) calls_[c].args[DNNL_ARG_SCRATCHPAD] = Placed(md, buffer);
    }
  }

  /*! \brief The scratchpad `prim` asks for (zero bytes: none). */
  static memory::desc ScratchpadDesc(const dnnl::primitive& prim) {
    const dnnl_memory_desc_t* md = dnnl_primitive_desc_query_md(prim.get_primitive_desc(), dnnl_query_scratchpad_md, 0);
    return md == nullptr ? memory::desc() : memory::desc(*md);
  }

  /*! \brief Each call's arguments as the C API takes them (the memories stay owned by `args`). */
  void PackArguments() {
    for (Call& c : calls_) {
      c.exec_args.clear();
      for (const auto& [role, mem] : c.args) c.exec_args.push_back(dnnl_exec_arg_t{role, mem.get()});
    }
  }

  /*! \brief Execute a prepared call's primitive: its argument array as is, no map, no vector. */
  void ExecutePrimitive(const Call& c) {
    dnnl_status_t status =
        dnnl_primitive_execute(c.prim.get(), stream_.get(), static_cast<int>(c.exec_args.size()), c.exec_args.data());
    if (status != dnnl_success) {
      TVM_FFI_THROW(RuntimeError) << "oneDNN region '" << spec_.name << "': a primitive failed (status " << status << ")";
    }
  }

  // ---- steps ----
  dnnl::primitive_attr PostOps(const StepSpec& s) const {
    dnnl::post_ops ops;
    if (s.residual >= 0) ops.append_sum(1.f);
    if (s.relu) ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    if (!s.activation.empty()) {
      float alpha = s.activation == "silu" ? 1.f : s.alpha;
      ops.append_eltwise(1.f, Activation(s.activation), alpha, s.beta);
    }
    dnnl::primitive_attr attr = UserScratchpad();
    attr.set_post_ops(ops);
    return attr;
  }

  /*! \brief The data types of a conv2d / matmul step: float32 throughout, or quantized. */
  struct Types {
    dt src = dt::f32, weights = dt::f32, bias = dt::f32, dst = dt::f32;
  };
  Types StepTypes(size_t k, dt data) const {
    const QuantSpec& q = spec_.steps[k].quant;
    if (!q.on) return Types{};
    if (data != dt::u8 && data != dt::s8) Fail(k, "a quantized step reads uint8 or int8 data");
    return Types{data, dt::s8, dt::s32, QuantType(q.dst_type)};
  }

  /*! \brief `attr` with the step's output scales (per output channel: mask on dim 1, the channels
   *         of conv2d's NCHW and of matmul's rows x N) and zero points, when it is quantized. */
  dnnl::primitive_attr Quantized(const StepSpec& s, dnnl::primitive_attr attr) const {
    const QuantSpec& q = s.quant;
    if (!q.on) return attr;
    attr.set_output_scales(q.scales.size() > 1 ? 1 << 1 : 0, q.scales);
    if (q.src_zero_point != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {q.src_zero_point});
    if (q.dst_zero_point != 0) attr.set_zero_points(DNNL_ARG_DST, 0, {q.dst_zero_point});
    return attr;
  }

  /*! \brief quantize (float32 -> u8/s8: x / scale rounded to nearest even, plus the zero point,
   *         saturated) or dequantize ((x - zero point) * scale -> float32), in the layout its input
   *         has, so a chain of blocked primitives stays blocked. */
  void SetupRequantize(size_t k) {
    const StepSpec& s = spec_.steps[k];
    const Value& in = values_[s.data];
    bool quantize = s.op == "quantize";
    dt from = in.desc.data_type();
    if (quantize ? from != dt::f32 : (from != dt::u8 && from != dt::s8)) {
      Fail(k, quantize ? "quantize reads float32" : "dequantize reads uint8 or int8");
    }
    if (quantize) return SetupQuantize(k);
    dnnl::primitive_attr attr = UserScratchpad();
    attr.set_output_scales(0, s.quant.scales);
    if (s.quant.src_zero_point != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {s.quant.src_zero_point});
    if (s.quant.dst_zero_point != 0) attr.set_zero_points(DNNL_ARG_DST, 0, {s.quant.dst_zero_point});
    memory dst = Output(k, WithType(in.desc, QuantType(s.quant.dst_type)));
    Call c;
    c.prim = dnnl::reorder(dnnl::reorder::primitive_desc(in.mem, dst, attr));
    c.args = {{DNNL_ARG_FROM, in.mem}, {DNNL_ARG_TO, dst}};
    calls_.push_back(std::move(c));
  }

  /*!
   * \brief quantize as ONNX (and ONNX Runtime) define it: a binary divide by the scale, rounded to
   *        an integer, then the zero point added (exact on integers), saturated by the conversion.
   *        A reorder would multiply by 1/scale and add the zero point before rounding: both round a
   *        few halves the other way.
   */
  void SetupQuantize(size_t k) {
    const StepSpec& s = spec_.steps[k];
    const Value& in = values_[s.data];
    memory::desc scalar_md = Plain(memory::dims(in.desc.dims().size(), 1));
    memory divisor(scalar_md, CpuEngine());
    *static_cast<float*>(divisor.get_data_handle()) = s.quant.scales[0];
    dnnl::post_ops ops;
    ops.append_eltwise(1.f, dnnl::algorithm::eltwise_round, 0.f, 0.f);
    if (s.quant.dst_zero_point != 0) {
      ops.append_eltwise(1.f, dnnl::algorithm::eltwise_linear, 1.f, static_cast<float>(s.quant.dst_zero_point));
    }
    dnnl::primitive_attr attr = UserScratchpad();
    attr.set_post_ops(ops);
    // In the value's layout when oneDNN has a jit kernel for it (2.6 has none for a blocked one),
    // else in nhwc / plain, reordered first.
    dt type = QuantType(s.quant.dst_type);
    auto make = [&](const memory::desc& md) {
      dnnl::binary::desc desc(dnnl::algorithm::binary_div, md, scalar_md, WithType(md, type));
      return dnnl::binary::primitive_desc(desc, attr, CpuEngine());
    };
    dnnl::binary::primitive_desc pd = FirstJit(JitCandidates(in.desc), make);
    memory src = Input(k, s.data, pd.src_desc(0));
    Call c;
    c.prim = dnnl::binary(pd);
    c.args = {{DNNL_ARG_SRC_0, src}, {DNNL_ARG_SRC_1, divisor}, {DNNL_ARG_DST, Output(k, pd.dst_desc())}};
    calls_.push_back(std::move(c));
  }

  /*! \brief Layouts to try for an elementwise step on `md`: its own, then nhwc (4-D), then plain. */
  static std::vector<memory::desc> JitCandidates(const memory::desc& md) {
    std::vector<memory::desc> out{md};
    memory::dims d = md.dims();
    if (d.size() == 4) out.push_back(memory::desc(d, md.data_type(), tag::nhwc));
    out.push_back(Plain(d, md.data_type()));
    return out;
  }

  /*! \brief The primitive `make` gives for the first layout oneDNN runs with a jit kernel (its
   *         reference kernels are 10-30x slower); the last layout's when none has one. */
  template <typename Make>
  static auto FirstJit(const std::vector<memory::desc>& layouts, Make make) -> decltype(make(layouts[0])) {
    for (size_t i = 0; i + 1 < layouts.size(); ++i) {
      try {
        auto pd = make(layouts[i]);
        if (std::string(pd.impl_info_str()).rfind("ref", 0) != 0) return pd;
      } catch (const dnnl::error&) {
      }
    }
    return make(layouts.back());
  }

  /*!
   * \brief a + b of two quantized values of one shape: a binary add with each source's scale,
   *        then `shift` (their zero points) and the output's zero point, and the ReLU as post-ops, in
   *        the layout `a` has (b is reordered into it if needed).
   */
  void SetupQuantizedAdd(size_t k) {
    const StepSpec& s = spec_.steps[k];
    const Value& a = values_[s.inputs[0]];
    const QuantSpec& q = s.quant;
    if (a.desc.dims() != values_[s.inputs[1]].desc.dims()) Fail(k, "add needs two values of one shape");
    memory::desc b_md = WithType(a.desc, values_[s.inputs[1]].desc.data_type());
    memory::desc y_md = WithType(a.desc, QuantType(q.dst_type));
    // relu(t) + zp is max(t + zp, zp): one linear post-op, then a clip at the zero point (2.6's
    // jit binary drops the second of two linear post-ops).
    float zp = static_cast<float>(q.dst_zero_point);
    dnnl::post_ops ops;
    ops.append_eltwise(1.f, dnnl::algorithm::eltwise_linear, 1.f, q.shift + zp);
    if (s.relu) ops.append_eltwise(1.f, dnnl::algorithm::eltwise_clip, zp, std::numeric_limits<float>::max());
    dnnl::primitive_attr attr = UserScratchpad();
    attr.set_scales(DNNL_ARG_SRC_0, 0, {q.scales[0]});
    attr.set_scales(DNNL_ARG_SRC_1, 0, {q.scales[1]});
    attr.set_post_ops(ops);
    dnnl::binary::desc desc(dnnl::algorithm::binary_add, a.desc, b_md, y_md);
    dnnl::binary::primitive_desc pd(desc, attr, CpuEngine());
    memory b = Input(k, s.inputs[1], b_md);
    Call c;
    c.prim = dnnl::binary(pd);
    c.args = {{DNNL_ARG_SRC_0, a.mem}, {DNNL_ARG_SRC_1, b}, {DNNL_ARG_DST, Output(k, y_md)}};
    calls_.push_back(std::move(c));
  }

  /*! \brief oneDNN's algorithm for an activation (checked when parsed); silu is swish with alpha 1. */
  static dnnl::algorithm Activation(const std::string& a) {
    if (a == "clip") return dnnl::algorithm::eltwise_clip;
    if (a == "sigmoid") return dnnl::algorithm::eltwise_logistic;
    if (a == "hardswish") return dnnl::algorithm::eltwise_hardswish;
    if (a == "gelu") return dnnl::algorithm::eltwise_gelu_erf;
    if (a == "gelu_tanh") return dnnl::algorithm::eltwise_gelu_tanh;
    return dnnl::algorithm::eltwise_swish;
  }

  void SetupConv(size_t k, const std::vector<DLTensor*>& t) {
    const StepSpec& s = spec_.steps[k];
    if (s.weight < 0 || s.weight >= spec_.num_inputs) Fail(k, "conv2d needs weights among the region's inputs");
    memory::dims x = values_[s.data].desc.dims(), y = OutputDims(k, t);
    const DLTensor* w = t[s.weight];
    if (x.size() != 4 || w->ndim != 4 || y.size() != 4 || s.padding.size() != 4 || s.strides.size() != 2 ||
        s.dilation.size() != 2) {
      Fail(k, "conv2d needs NCHW/OIHW tensors and 2-D strides, dilation and (4) padding");
    }
    int64_t g = s.groups;
    // Quantized: the source as stored (u8 or s8), s8 weights, an s32 bias, the output's type.
    Types ty = StepTypes(k, values_[s.data].desc.data_type());
    memory::dims wdims(w->shape, w->shape + 4);
    memory::desc user_w(wdims, ty.weights, tag::oihw);
    if (g > 1) {
      wdims = {g, w->shape[0] / g, w->shape[1], w->shape[2], w->shape[3]};
      user_w = memory::desc(wdims, ty.weights, tag::goihw);
    }
    memory::dims dilation{s.dilation[0] - 1, s.dilation[1] - 1};
    memory::dims pad_l{s.padding[0], s.padding[1]}, pad_r{s.padding[2], s.padding[3]};
    memory::desc b_md = s.bias >= 0 ? memory::desc({y[1]}, ty.bias, tag::x) : memory::desc();
    dnnl::convolution_forward::desc desc(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, memory::desc(x, ty.src, tag::any),
        memory::desc(wdims, ty.weights, tag::any), b_md, memory::desc(y, ty.dst, tag::any),
        memory::dims(s.strides.begin(), s.strides.end()), dilation, pad_l, pad_r);
    dnnl::convolution_forward::primitive_desc pd(desc, Quantized(s, PostOps(s)), CpuEngine());
    memory src = Input(k, s.data, pd.src_desc());
    memory wei = Weights(k, s.weight, user_w, pd.weights_desc());
    memory dst = Output(k, pd.dst_desc());
    Call c;
    c.prim = dnnl::convolution_forward(pd);
    c.args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
    if (s.bias >= 0) c.args[DNNL_ARG_BIAS] = Vector(k, s.bias, b_md);
    if (s.residual >= 0) Residual(k, s.residual, dst);
    calls_.push_back(std::move(c));
  }

  void SetupMatmul(size_t k, const std::vector<DLTensor*>& t) {
    const StepSpec& s = spec_.steps[k];
    if (s.weight < 0 || s.weight >= spec_.num_inputs) Fail(k, "matmul needs weights among the region's inputs");
    memory::dims x = values_[s.data].desc.dims(), y = OutputDims(k, t);
    const DLTensor* w = t[s.weight];
    if (x.size() < 2 || w->ndim != (s.weight_panels ? 3 : 2) || y.size() != x.size()) {
      Fail(k, s.weight_panels ? "matmul needs data of rank 2-5 and a weight in panels (N / 16, K, 16)"
                              : "matmul needs data of rank 2-5 and a 2-D weight");
    }
    // Data of higher rank is contiguous, so it is read as rows x K (and written as rows x N).
    int64_t kk = x.back(), n = y.back(), rows = Elements(x) / kk;
    Types ty = StepTypes(k, values_[s.data].desc.data_type());
    memory::desc src_md({rows, kk}, ty.src, tag::ab), dst_md({rows, n}, ty.dst, tag::ab);
    memory::desc w_md({kk, n}, ty.weights, s.weight_transposed ? tag::ba : tag::ab);
    memory::desc b_md = s.bias >= 0 ? memory::desc({1, n}, ty.bias, tag::ab) : memory::desc();
    if (s.weight_panels) {
      CheckPanels(k, w, kk, n);
      if (rows == 1 && s.residual < 0) return SetupOneRowStored(k, y, t);
      w_md = memory::desc({kk, n}, ty.weights, tag::BA16a16b);  // the same bytes, as 16 divides K
    }
    if (rows == 1 && !s.quant.on && !s.weight_panels) {
      OneRowKernel kernel = OneRowChoice();
      if (kernel == OneRowKernel::kStored && !s.weight_transposed && s.residual < 0) return SetupOneRowStored(k, y, t);
      if (kernel != OneRowKernel::kMatmul) return SetupOneRow(k, y, src_md, dst_md);
    }
    dnnl::matmul::desc desc(src_md, w_md, b_md, dst_md);
    dnnl::matmul::primitive_desc pd(desc, Quantized(s, PostOps(s)), CpuEngine());
    memory src = Input(k, s.data, src_md);
    memory wei = Weights(k, s.weight, w_md, w_md);
    Output(k, Plain(y, ty.dst));
    memory dst = Alias(values_[spec_.num_inputs + k], dst_md);
    Call c;
    c.prim = dnnl::matmul(pd);
    c.args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
    if (s.bias >= 0) c.args[DNNL_ARG_BIAS] = Vector(k, s.bias, b_md);
    if (s.residual >= 0) Residual(k, s.residual, dst);
    calls_.push_back(std::move(c));
  }

  /*! \brief A weight in panels must be float32 (N / 16, K, 16) with 16 dividing K (oneDNN's BA16a16b
   *         then holds the same bytes) and the step must take no quantized data. */
  void CheckPanels(size_t k, const DLTensor* w, int64_t kk, int64_t n) {
    const StepSpec& s = spec_.steps[k];
    int64_t width = one_row_matmul::kPanelWidth;
    if (TypeOf(w) != dt::f32 || s.quant.on) Fail(k, "a weight in panels must be float32, and the data too");
    if (kk % width != 0 || n % width != 0 || w->shape[0] != n / width || w->shape[1] != kk || w->shape[2] != width) {
      Fail(k, "a weight in panels must be (N / 16, K, 16) with 16 dividing K and N; got (" +
                  std::to_string(w->shape[0]) + ", " + std::to_string(w->shape[1]) + ", " + std::to_string(w->shape[2]) +
                  ") for K " + std::to_string(kk) + ", N " + std::to_string(n));
    }
  }

  /*!
   * \brief A one-row f32 matmul (a decode step's projections and LM head) as oneDNN's inner product,
   *        on the weight layout it picks, reordered once (Weights): 1.9-2.2x faster than matmul on
   *        the stored layout for a 576 x 49152 LM head (bench/llm_gemv.py). The reordered copy costs
   *        the weights' size again; TVM_HETERO_DNNL_ONE_ROW=matmul keeps the stored layout instead.
   */
  void SetupOneRow(size_t k, const memory::dims& y, const memory::desc& src_md, const memory::desc& dst_md) {
    const StepSpec& s = spec_.steps[k];
    memory::dim kk = src_md.dims()[1], n = dst_md.dims()[1];
    memory::desc stored({n, kk}, dt::f32, s.weight_transposed ? tag::ab : tag::ba);  // (out, in) view
    memory::desc any({n, kk}, dt::f32, tag::any);
    memory::desc b_md = s.bias >= 0 ? memory::desc({n}, dt::f32, tag::a) : memory::desc();
    dnnl::inner_product_forward::desc desc(dnnl::prop_kind::forward_inference, src_md, any, b_md, dst_md);
    dnnl::inner_product_forward::primitive_desc pd(desc, PostOps(s), CpuEngine());
    memory src = Input(k, s.data, src_md);
    memory wei = Weights(k, s.weight, stored, pd.weights_desc());
    Output(k, Plain(y, dt::f32));
    memory dst = Alias(values_[spec_.num_inputs + k], dst_md);
    Call c;
    c.prim = dnnl::inner_product_forward(pd);
    c.args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
    if (s.bias >= 0) c.args[DNNL_ARG_BIAS] = Vector(k, s.bias, b_md);
    if (s.residual >= 0) Residual(k, s.residual, dst);
    calls_.push_back(std::move(c));
  }

  /*!
   * \brief data (rows x K, any rank read as rows) @ dequantize(weight)ᵀ + bias with the weight stored
   *        (N, K) uint8 with one zero point and one scale per output: our VNNI kernel
   *        (backends/int8_matmul.h) on the stored weights, so nothing is reordered or copied; its
   *        quantized rows live in the arena.
   */
  void SetupInt8WeightMatmul(size_t k, const std::vector<DLTensor*>& t) {
    const StepSpec& s = spec_.steps[k];
    for (int role : {s.weight, s.scale, s.zero_point, s.bias}) {
      if (role >= spec_.num_inputs) Fail(k, "the weight, scale, zero point and bias must be inputs of the region");
    }
    if (TypeOf(t[s.zero_point]) != dt::u8 || Elements(memory::dims(t[s.zero_point]->shape, t[s.zero_point]->shape +
                                                                   t[s.zero_point]->ndim)) != 1) {
      Fail(k, "the zero point must be one uint8");
    }
    const DLTensor* w = t[s.weight];
    const DLTensor* scale = t[s.scale];
    memory::dims x = values_[s.data].desc.dims(), y = OutputDims(k, t);
    if (w->ndim != 2 || TypeOf(w) != dt::u8) Fail(k, "the weight must be a 2-D uint8 tensor (out, in)");
    int64_t n = w->shape[0], kk = w->shape[1];
    auto elements = [](const DLTensor* v) { return Elements(memory::dims(v->shape, v->shape + v->ndim)); };
    if (TypeOf(scale) != dt::f32 || elements(scale) != n) Fail(k, "the scale must hold one float32 per output");
    if (s.bias >= 0 && (TypeOf(t[s.bias]) != dt::f32 || elements(t[s.bias]) != n)) {
      Fail(k, "the bias must hold one float32 per output");
    }
    if (x.empty() || x.back() != kk || y.empty() || y.back() != n || Elements(x) / kk != Elements(y) / n) {
      Fail(k, "the data's last axis must be the weight's inputs and the output's the weight's outputs");
    }
    if (values_[s.data].desc.data_type() != dt::f32) Fail(k, "the data must be float32");
    OwnStep step;
    step.weight = s.weight;
    step.scale = s.scale;
    step.zero_point = s.zero_point;
    step.bias = s.bias;
    step.rows = Elements(x) / kk;
    step.out = n;
    step.in = kk;
    step.src = Input(k, s.data, Plain({step.rows, kk}));
    Output(k, Plain(y));
    step.dst = Alias(values_[spec_.num_inputs + k], Plain({step.rows, n}));
    size_t bytes = int8_matmul::ScratchBytes(step.rows, kk);
    step.scratch = Placed(memory::desc({static_cast<memory::dim>(bytes)}, dt::u8, tag::a),
                          NewBuffer(bytes, static_cast<int>(k), static_cast<int>(k)));
    Call c;
    c.own = static_cast<int>(own_steps_.size());
    own_steps_.push_back(std::move(step));
    calls_.push_back(std::move(c));
  }

  /*! \brief Run a prepared step of our own kernels on this call's tensors. */
  void ExecuteOwn(const OwnStep& step, const ffi::PackedArgs& args) {
    const float* bias = step.bias >= 0 ? static_cast<const float*>(Arg(args, step.bias)->data) : nullptr;
    if (!step.int8) {
      auto multiply = step.panels ? one_row_matmul::MultiplyPanels : one_row_matmul::Multiply;
      multiply(static_cast<const float*>(step.src.get_data_handle()), static_cast<const float*>(Arg(args, step.weight)->data),
               bias, static_cast<float*>(step.dst.get_data_handle()), step.in, step.out);
      return;
    }
    int8_matmul::Weights w;
    w.data = static_cast<const uint8_t*>(Arg(args, step.weight)->data);
    w.scales = static_cast<const float*>(Arg(args, step.scale)->data);
    w.zero_point = *static_cast<const uint8_t*>(Arg(args, step.zero_point)->data);
    w.bias = bias;
    w.out = step.out;
    w.in = step.in;
    int8_matmul::Multiply(static_cast<const float*>(step.src.get_data_handle()), step.rows, w,
                          static_cast<float*>(step.dst.get_data_handle()), step.scratch.get_data_handle());
  }

  /*! \brief How a one-row float32 matmul runs: our kernel on the stored (K, N) weights (default),
   *         oneDNN's inner product on weights reordered once (a second copy of them), or oneDNN's
   *         matmul; TVM_HETERO_DNNL_ONE_ROW=stored|inner_product|matmul, read when a region is set up. */
  enum class OneRowKernel { kStored, kInnerProduct, kMatmul };
  static OneRowKernel OneRowChoice() {
    const char* v = std::getenv("TVM_HETERO_DNNL_ONE_ROW");
    if (v != nullptr && std::strcmp(v, "matmul") == 0) return OneRowKernel::kMatmul;
    if (v != nullptr && std::strcmp(v, "inner_product") == 0) return OneRowKernel::kInnerProduct;
    return OneRowKernel::kStored;
  }

  /*!
   * \brief A one-row float32 matmul on the weights as stored, (K, N) or in panels: one_row_matmul.h,
   *        reading every weight once and copying none (as fast as the inner product on its reordered copy for a
   *        decode step's shapes, bench/llm_gemv.py); its activation, if any, in place after it.
   */
  void SetupOneRowStored(size_t k, const memory::dims& y, const std::vector<DLTensor*>& t) {
    const StepSpec& s = spec_.steps[k];
    const DLTensor* w = t[s.weight];
    OwnStep step;
    step.int8 = false;
    step.panels = s.weight_panels != 0;
    step.weight = s.weight;
    step.bias = s.bias;
    step.rows = 1;
    step.in = step.panels ? w->shape[1] : w->shape[0];
    step.out = step.panels ? w->shape[0] * w->shape[2] : w->shape[1];
    if (TypeOf(w) != dt::f32) Fail(k, "the weight must be float32");
    if (values_[s.data].desc.dims().back() != step.in || y.back() != step.out) {
      Fail(k, "the data's last axis must be the weight's rows and the output's its columns");
    }
    if (s.bias >= 0 && (s.bias >= spec_.num_inputs || TypeOf(t[s.bias]) != dt::f32 ||
                        Elements(memory::dims(t[s.bias]->shape, t[s.bias]->shape + t[s.bias]->ndim)) != step.out)) {
      Fail(k, "the bias must be an input of the region with one float32 per output");
    }
    step.src = Input(k, s.data, Plain({1, step.in}));
    Output(k, Plain(y));
    step.dst = Alias(values_[spec_.num_inputs + k], Plain({1, step.out}));
    Call c;
    c.own = static_cast<int>(own_steps_.size());
    own_steps_.push_back(std::move(step));
    calls_.push_back(std::move(c));
    if (s.relu || !s.activation.empty()) ActivationInPlace(s, own_steps_.back().dst);
  }

  /*! \brief The step's ReLU and other activation applied in place to `dst` (after a kernel without post-ops). */
  void ActivationInPlace(const StepSpec& s, const memory& dst) {
    if (s.relu) ReluInPlace(dst);
    if (s.activation.empty()) return;
    float alpha = s.activation == "silu" ? 1.f : s.alpha;
    dnnl::eltwise_forward::desc desc(dnnl::prop_kind::forward_inference, Activation(s.activation), dst.get_desc(),
                                     alpha, s.beta);
    Call c;
    c.prim = dnnl::eltwise_forward(dnnl::eltwise_forward::primitive_desc(desc, UserScratchpad(), CpuEngine()));
    c.args = {{DNNL_ARG_SRC, dst}, {DNNL_ARG_DST, dst}};
    calls_.push_back(std::move(c));
  }

  /*! \brief a @ b over equal batch dims, both computed (attention's scores and context), plain. */
  void SetupBatchMatmul(size_t k, const std::vector<DLTensor*>& t) {
    const StepSpec& s = spec_.steps[k];
    memory::dims a = values_[s.inputs[0]].desc.dims(), b = values_[s.inputs[1]].desc.dims(), y = OutputDims(k, t);
    size_t r = a.size();
    if (r < 3 || r > 4 || b.size() != r || y.size() != r || a[r - 1] != b[r - 2] ||
        !std::equal(a.begin(), a.end() - 2, b.begin())) {
      Fail(k, "batch_matmul needs (..., M, K) @ (..., K, N) of rank 3-4 with equal batch dims");
    }
    dnnl::matmul::desc desc(Plain(a), Plain(b), Plain(y));
    dnnl::matmul::primitive_desc pd(desc, PostOps(s), CpuEngine());
    Call c;
    c.prim = dnnl::matmul(pd);
    memory src = Input(k, s.inputs[0], Plain(a));
    memory wei = Input(k, s.inputs[1], Plain(b));
    c.args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, Output(k, Plain(y))}};
    calls_.push_back(std::move(c));
  }

  void SetupPool(size_t k, const std::vector<DLTensor*>& t) {
    const StepSpec& s = spec_.steps[k];
    const Value& in = values_[s.data];
    memory::dims x = in.desc.dims(), y = OutputDims(k, t);
    if (x.size() != 4 || y.size() != 4 || s.padding.size() != 4) Fail(k, "pooling needs NCHW tensors");
    // In integers: the value's own u8/s8, requantized by a linear post-op (quant.scales[0], shift).
    dt type = in.desc.data_type();
    bool integer = type == dt::u8 || type == dt::s8;
    if (integer != s.quant.on) Fail(k, s.quant.on ? "pooling in integers reads u8 or s8" : "pooling reads float32");
    // A blocked (float) or nhwc (integer: 2.6's jit has no blocked u8 pooling) layout: oneDNN's
    // jit pooling needs one (its plain-NCHW pooling is ~30x slower).
    memory::desc src_md = integer && in.desc != memory::desc(x, type, tag::nhwc) ? memory::desc(x, type, tag::nhwc)
                          : IsPlain(in.desc)                                     ? memory::desc(x, type, tag::nChw8c)
                                                                                 : in.desc;
    dt dst_type = integer ? QuantType(s.quant.dst_type) : dt::f32;
    dnnl::primitive_attr attr = PostOps(s);
    if (integer && (s.quant.scales[0] != 1.f || s.quant.shift != 0.f)) {
      dnnl::post_ops ops = attr.get_post_ops();
      ops.append_eltwise(1.f, dnnl::algorithm::eltwise_linear, s.quant.scales[0], s.quant.shift);
      attr.set_post_ops(ops);
    }
    memory::dims dilation{s.dilation[0] - 1, s.dilation[1] - 1};
    memory::dims pad_l{s.padding[0], s.padding[1]}, pad_r{s.padding[2], s.padding[3]};
    dnnl::algorithm alg = s.op == "max_pool2d"       ? dnnl::algorithm::pooling_max
                          : s.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                                : dnnl::algorithm::pooling_avg_exclude_padding;
    dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, alg, src_md,
                                        memory::desc(y, dst_type, tag::any),
                                        memory::dims(s.strides.begin(), s.strides.end()),
                                        memory::dims(s.pool_size.begin(), s.pool_size.end()), dilation, pad_l, pad_r);
    dnnl::pooling_v2_forward::primitive_desc pd(desc, attr, CpuEngine());
    memory src = Input(k, s.data, src_md);
    memory dst = Output(k, pd.dst_desc());
    Call c;
    c.prim = dnnl::pooling_v2_forward(pd);
    c.args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}};
    calls_.push_back(std::move(c));
  }

  /*!
   * \brief Channel shuffle (reshape to (N, g, C/g, H, W), swap g and C/g, reshape back). From a
   *        plain value: one reorder, the source viewed as (N, g, C/g, H, W), the destination as the
   *        same dims with the strides of (N, C/g, g, H, W). From a blocked one: oneDNN's shuffle,
   *        which transposes the channels read as (C/G, G) with G = C/g, in that layout.
   */
  void SetupChannelShuffle(size_t k, const std::vector<DLTensor*>&) {
    const StepSpec& s = spec_.steps[k];
    const Value& in = values_[s.data];
    memory::dims x = in.desc.dims();
    int64_t g = s.groups;
    if (x.size() != 4 || g < 1 || x[1] % g != 0) {
      Fail(k, "channel_shuffle needs an NCHW tensor whose channels divide into " + std::to_string(g) + " groups");
    }
    int64_t n = x[0], c = x[1], h = x[2], w = x[3];
    Call call;
    const dnnl_memory_desc_t& md = in.desc.data;
    if (md.format_kind == dnnl_blocked && md.format_desc.blocking.inner_nblks == 0) {
      // Plain or nhwc (an int8 convolution's): channel i of group j read through a strided view,
      // its dims ordered by the value's strides (nhwc: (n, h, w, g, C/g), contiguous as read).
      const dnnl_dims_t& st = md.format_desc.blocking.strides;
      dt type = in.desc.data_type();  // float32, or a QDQ model's u8 / s8 (data movement only)
      bool nhwc = st[1] == 1;
      memory::dims dims = nhwc ? memory::dims{n, h, w, g, c / g} : memory::dims{n, g, c / g, h, w};
      memory::dims from = nhwc ? memory::dims{st[0], st[2], st[3], st[1] * (c / g), st[1]}
                               : memory::dims{st[0], st[1] * (c / g), st[1], st[2], st[3]};
      memory::dims to = nhwc ? memory::dims{st[0], st[2], st[3], st[1], st[1] * g}
                             : memory::dims{st[0], st[1], st[1] * g, st[2], st[3]};
      memory src = Alias(in, memory::desc(dims, type, from));
      Output(k, in.desc);
      memory dst = Alias(values_[spec_.num_inputs + k], memory::desc(dims, type, to));
      calls_.push_back(Reorder(src, dst));
      return;
    }
    dnnl::shuffle_forward::desc desc(dnnl::prop_kind::forward_inference, in.desc, 1, static_cast<int>(c / g));
    dnnl::shuffle_forward::primitive_desc pd(desc, CpuEngine(), UserScratchpad());
    memory src = Input(k, s.data, pd.src_desc());
    memory dst = Output(k, pd.dst_desc());
    call.prim = dnnl::shuffle_forward(pd);
    call.args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}};
    calls_.push_back(std::move(call));
  }

  /*! \brief Softmax along the step's axis of a plain tensor of rank 1-5. */
  void SetupSoftmax(size_t k, const std::vector<DLTensor*>&) {
    const StepSpec& s = spec_.steps[k];
    memory::dims x = values_[s.data].desc.dims();
    if (s.axis < 0 || s.axis >= static_cast<int64_t>(x.size())) {
      Fail(k, "softmax axis " + std::to_string(s.axis) + " outside a tensor of rank " + std::to_string(x.size()));
    }
    memory::desc md = Plain(x);
    dnnl::softmax_forward::desc desc(dnnl::prop_kind::forward_inference, md, static_cast<int>(s.axis));
    Call c;
    c.prim = dnnl::softmax_forward(dnnl::softmax_forward::primitive_desc(desc, UserScratchpad(), CpuEngine()));
    memory src = Input(k, s.data, md);
    c.args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, Output(k, md)}};
    calls_.push_back(std::move(c));
  }

  /*! \brief Layer norm over the last axis of a plain tensor of rank 2-5, with scale and shift. */
  void SetupLayerNorm(size_t k, const std::vector<DLTensor*>& t) {
    const StepSpec& s = spec_.steps[k];
    memory::dims x = values_[s.data].desc.dims();
    if (x.size() < 2 || s.weight < 0 || s.bias < 0) Fail(k, "layer_norm needs a 2-5-D tensor, a scale and a shift");
    int64_t channels = x.back();
    for (int role : {s.weight, s.bias}) {
      if (role >= spec_.num_inputs) Fail(k, "layer_norm's scale and shift must be inputs of the region");
      const DLTensor* v = t[role];
      int64_t size = Elements(memory::dims(v->shape, v->shape + v->ndim));
      if (size != channels) {
        Fail(k, "layer_norm argument " + std::to_string(role) + " has " + std::to_string(size) +
                    " elements, the last axis " + std::to_string(channels));
      }
    }
    memory::desc md = Plain(x), vec({channels}, dt::f32, tag::a);
    auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
    dnnl::layer_normalization_forward::desc desc(dnnl::prop_kind::forward_inference, md, s.epsilon, flags);
    Call c;
    c.prim = dnnl::layer_normalization_forward(dnnl::layer_normalization_forward::primitive_desc(desc, UserScratchpad(), CpuEngine()));
    memory src = Input(k, s.data, md);
    c.args = {{DNNL_ARG_SRC, src},
              {DNNL_ARG_DST, Output(k, md)},
              {DNNL_ARG_SCALE, Vector(k, s.weight, vec)},
              {DNNL_ARG_SHIFT, Vector(k, s.bias, vec)}};
    calls_.push_back(std::move(c));
  }

  /*! \brief Local response norm across channels, in the layout its input has:
   *         x / (k + alpha / n * sum of x^2 over n channels)^beta. */
  void SetupLrn(size_t k) {
    const StepSpec& s = spec_.steps[k];
    const Value& in = values_[s.data];
    if (in.desc.dims().size() != 4) Fail(k, "lrn needs an NCHW tensor");
    dnnl::lrn_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::lrn_across_channels, in.desc,
                                 s.local_size, s.alpha, s.beta, s.k);
    dnnl::lrn_forward::primitive_desc pd(desc, UserScratchpad(), CpuEngine());
    Call c;
    c.prim = dnnl::lrn_forward(pd);
    memory src = Input(k, s.data, pd.src_desc());
    c.args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, Output(k, pd.dst_desc())}};
    calls_.push_back(std::move(c));
  }

  /*!
   * \brief data * weight + bias per channel of an NCHW tensor, then the activations: a binary
   *        multiply by the (1, C, 1, 1) weight with the add as a binary post-op, in the layout the
   *        data has (DenseNet's batch norm + ReLU before each convolution).
   */
  void SetupScaleShift(size_t k) {
    const StepSpec& s = spec_.steps[k];
    const Value& in = values_[s.data];
    memory::dims x = in.desc.dims();
    if (x.size() != 4) Fail(k, "scale_shift needs an NCHW tensor");
    // In integers: u8/s8 in and out, the vectors already in the output's units (docs/byoc.md).
    bool integer = in.desc.data_type() == dt::u8 || in.desc.data_type() == dt::s8;
    if (integer != s.quant.on) Fail(k, s.quant.on ? "scale_shift in integers reads u8 or s8" : "scale_shift reads float32");
    dt dst_type = integer ? QuantType(s.quant.dst_type) : dt::f32;
    memory::desc vec({1, x[1], 1, 1}, dt::f32, tag::abcd);
    memory scale = Vector(k, s.weight, vec), shift = Vector(k, s.bias, vec);
    for (int role : {s.weight, s.bias}) {
      if (values_[role].desc.get_size() != vec.get_size()) Fail(k, "scale and shift need one value per channel");
    }
    dnnl::post_ops ops;
    ops.append_binary(dnnl::algorithm::binary_add, vec);
    if (s.relu) ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    if (!s.activation.empty()) ops.append_eltwise(1.f, Activation(s.activation), s.activation == "silu" ? 1.f : s.alpha, s.beta);
    dnnl::primitive_attr attr = UserScratchpad();
    attr.set_post_ops(ops);
    dnnl::binary::desc desc(dnnl::algorithm::binary_mul, in.desc, vec, memory::desc(x, dst_type, tag::any));
    dnnl::binary::primitive_desc pd(desc, attr, CpuEngine());
    Call c;
    c.prim = dnnl::binary(pd);
    memory src = Input(k, s.data, pd.src0_desc());
    c.args = {{DNNL_ARG_SRC_0, src},
              {DNNL_ARG_SRC_1, scale},
              {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, shift},
              {DNNL_ARG_DST, Output(k, pd.dst_desc())}};
    calls_.push_back(std::move(c));
  }

  /*! \brief The step's ReLU applied in place to `dst` (for primitives without post-ops). */
  void ReluInPlace(const memory& dst) {
    dnnl::eltwise_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::eltwise_relu,
                                     dst.get_desc(), 0.f, 0.f);
    Call c;
    c.prim = dnnl::eltwise_forward(dnnl::eltwise_forward::primitive_desc(desc, UserScratchpad(), CpuEngine()));
    c.args = {{DNNL_ARG_SRC, dst}, {DNNL_ARG_DST, dst}};
    calls_.push_back(std::move(c));
  }

  /*! \brief Concatenation along the step's axis, reading every input in the layout it has, then
   *         the step's ReLU (ShuffleNet's concat + ReLU). */
  void SetupConcat(size_t k, const std::vector<DLTensor*>& t) {
    if (spec_.steps[k].quant.on) return SetupQuantizedConcat(k, t);
    const StepSpec& s = spec_.steps[k];
    memory::dims y = OutputDims(k, t);
    if (s.axis < 0 || s.axis >= static_cast<int64_t>(y.size())) Fail(k, "concat axis outside the output");
    std::vector<memory::desc> srcs;
    for (int id : s.inputs) srcs.push_back(values_[id].desc);
    dnnl::concat::primitive_desc pd(memory::desc(y, dt::f32, tag::any), static_cast<int>(s.axis), srcs, CpuEngine(), UserScratchpad());
    Call c;
    c.prim = dnnl::concat(pd);
    for (size_t i = 0; i < s.inputs.size(); ++i) c.args[DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i)] = values_[s.inputs[i]].mem;
    memory dst = Output(k, pd.dst_desc());
    c.args[DNNL_ARG_DST] = dst;
    calls_.push_back(std::move(c));
    if (s.relu) ReluInPlace(dst);
  }

  /*!
   * \brief Concatenation in integers: each input requantized to the output's scale and zero point
   *        by one reorder into its slice of the output (nhwc for NCHW values, so any channel offset
   *        is a view; plain otherwise). Inputs of the output's own scale and zero point are copies.
   */
  void SetupQuantizedConcat(size_t k, const std::vector<DLTensor*>& t) {
    const StepSpec& s = spec_.steps[k];
    const QuantSpec& q = s.quant;
    memory::dims y = OutputDims(k, t);
    if (s.axis < 0 || s.axis >= static_cast<int64_t>(y.size())) Fail(k, "concat axis outside the output");
    dt type = QuantType(q.dst_type);
    memory::desc y_md = y.size() == 4 ? memory::desc(y, type, tag::nhwc) : Plain(y, type);
    Output(k, y_md);
    const Value& out = values_[spec_.num_inputs + k];
    memory::dims offsets(y.size(), 0);
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      const Value& in = values_[s.inputs[i]];
      memory::dims d = in.desc.dims();
      if (d.size() != y.size() || (in.desc.data_type() != dt::u8 && in.desc.data_type() != dt::s8)) {
        Fail(k, "a concat in integers joins u8/s8 values of the output's rank");
      }
      memory to = Alias(out, y_md.submemory_desc(d, offsets));
      offsets[s.axis] += d[s.axis];
      dnnl::primitive_attr attr = UserScratchpad();
      attr.set_output_scales(0, {q.scales[i]});
      if (q.src_zero_points[i] != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {q.src_zero_points[i]});
      if (q.dst_zero_point != 0) attr.set_zero_points(DNNL_ARG_DST, 0, {q.dst_zero_point});
      Call c;
      c.prim = dnnl::reorder(dnnl::reorder::primitive_desc(in.mem, to, attr));
      c.args = {{DNNL_ARG_FROM, in.mem}, {DNNL_ARG_TO, to}};
      calls_.push_back(std::move(c));
    }
    if (offsets[s.axis] != y[s.axis]) Fail(k, "the inputs do not fill the concat's output");
  }

  void Execute(const ffi::PackedArgs& args) {
    PointArena();
    for (auto& [m, arg] : bindings_) m.set_data_handle(Arg(args, arg)->data);
    uint64_t generation = weights_generation_->load(std::memory_order_acquire);
    bool single = false;  // whether the calling thread's OpenMP count is 1 now (a small step's)
    for (Call& c : calls_) {
      if (c.single != single) {
        SetOmpThreads(c.single ? 1 : team_);
        single = c.single;
      }
      if (c.weight_arg >= 0) {  // new weights (first call, new address, or parameters set): reorder once
        void* w = Arg(args, c.weight_arg)->data;
        if (w == c.weight_seen && generation == c.generation_seen) continue;
        c.weight_seen = w;
        c.generation_seen = generation;
        if (c.shared) {  // another call site (another frame) may have reordered them already
          SharedWeight& sw = *c.shared;
          std::lock_guard<std::mutex> lock(sw.mu);
          if (sw.filled && sw.seen == w && sw.generation == generation) continue;
          ExecutePrimitive(c);
          stream_.wait();
          g_weight_reorders.fetch_add(1, std::memory_order_relaxed);
          sw.filled = true;
          sw.seen = w;
          sw.generation = generation;
          continue;
        }
        g_weight_reorders.fetch_add(1, std::memory_order_relaxed);
      } else if (c.own >= 0) {
        ExecuteOwn(own_steps_[c.own], args);
        continue;
      } else if (c.copy_from >= 0) {
        void* from = Arg(args, c.copy_from)->data;
        void* to = Arg(args, c.copy_to)->data;
        if (from != to) std::memcpy(to, from, c.copy_bytes);
        continue;
      }
      ExecutePrimitive(c);
    }
    if (single) SetOmpThreads(team_);
    stream_.wait();
  }


  /*! \brief What the compiler wrote. */
  RegionSpec spec_;
  /*! \brief The module's parameter generation (see DnnlRegionModule). */
  std::shared_ptr<std::atomic<uint64_t>> weights_generation_;
  /*! \brief The module's shared reordered weights. */
  std::shared_ptr<WeightCache> weight_cache_;
  /*! \brief The first call's tensors while Setup runs (null otherwise). */
  const std::vector<DLTensor*>* setup_tensors_ = nullptr;
  /*! \brief Whether Setup has run. */
  bool ready_ = false;
  /*! \brief OpenMP's thread count when Setup ran: what steps above kParallelWork run on. */
  int team_ = 1;
  /*! \brief The region's stream on the CPU engine. */
  dnnl::stream stream_{CpuEngine()};
  /*! \brief Every value: the call's inputs, then each step's output (setup only). */
  std::vector<Value> values_;
  /*! \brief The arena's buffers (setup only) and the memories placed in them. */
  std::vector<Buffer> buffers_;
  std::vector<std::pair<memory, int>> placements_;
  /*! \brief Memories pointed at a call argument on every call. */
  std::vector<std::pair<memory, int>> bindings_;
  /*! \brief What every call runs, in order. */
  std::vector<Call> calls_;
  /*! \brief The matmuls among them that our own kernels run. */
  std::vector<OwnStep> own_steps_;
  /*! \brief Offset of each placed memory in the arena, its size, and the scratch it points into. */
  std::vector<size_t> offsets_;
  size_t arena_bytes_ = 0;
  char* arena_base_ = nullptr;
};
namespace {
/*! \brief OpenMP's thread count (libgomp is loaded by libdnnl), or -1. */
int OmpMaxThreads() {
  using Fn = int (*)();
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  return fn ? fn() : -1;
}

uint64_t WeightReorders() { return g_weight_reorders.load(std::memory_order_relaxed); }

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
     << "\", \"threads\": " << OmpMaxThreads() << ", \"scratch_bytes\": " << scratch_bytes_total.load() << "}";
  return os.str();
}
}  // namespace

#else  // no oneDNN

bool DnnlAvailable() { return false; }

class WeightCache {};

class RegionExec {
 public:
  RegionExec(RegionSpec spec, std::shared_ptr<std::atomic<uint64_t>>, std::shared_ptr<WeightCache>)
      : spec_(std::move(spec)) {}
  void Run(ffi::PackedArgs) {
    TVM_FFI_THROW(RuntimeError) << "oneDNN region '" << spec_.name
                                << "': libtvm_hetero was built without oneDNN (install libdnnl-dev and rebuild)";
  }

 private:
  RegionSpec spec_;
};

namespace {
uint64_t WeightReorders() { return 0; }
void OmpSetNumThreads(int) {}
std::string Info() { return "{\"available\": false}"; }
}  // namespace

#endif  // TVM_HETERO_WITH_ONEDNN

DnnlRegionModule::DnnlRegionModule(std::string json_text)
    : json_text_(std::move(json_text)), weight_cache_(std::make_shared<WeightCache>()) {
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
  // A fresh executor per request: each call site owns its memories; reordered weights are shared
  // between the call sites reading the same weights (the frames of one runtime).
  auto region = std::make_shared<RegionExec>(it->second, weights_generation_, weight_cache_);
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
      .def("tvm_hetero.dnnl.set_num_threads", [](int n) { OmpSetNumThreads(n); })
      .def("tvm_hetero.dnnl.weight_reorders", []() { return static_cast<int64_t>(WeightReorders()); });
}

}  // namespace dnnl_backend
}  // namespace tvm_hetero

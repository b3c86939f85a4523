/*!
 * \file tvm_hetero/backends/dnnl_region.h
 * \brief The oneDNN backend's regions: what the compiler writes for each (`RegionSpec`) and the
 *        module that runs them (`DnnlRegionModule`, kind "tvm_hetero_dnnl").
 *
 * A region is a short program of oneDNN primitives (steps), each with its fused post-ops (bias,
 * residual sum, activation); the values passed between steps stay in the layouts the primitives
 * chose and are reordered only where they enter or leave the region. The compiler describes every
 * region of a graph in one JSON document (docs/byoc.md); the module holds that text, serializes it
 * with SaveToBytes, and is rebuilt from it by the loader `ffi.Module.load_from_bytes.tvm_hetero_dnnl`.
 * Weights are graph parameters, passed to the region like any kernel argument, so the module holds
 * no tensors. Every GetFunction returns a fresh executor for one call site (the graph runtime asks
 * once per node): its primitives, reorders, argument maps and the plan of its values' arena are
 * built on its first call, from the shapes of its arguments (with the primitives' scratchpads in
 * the arena and their argument arrays packed), and later calls only point memories at the arguments
 * (and the arena at the calling thread's scratch) and execute -- no allocation of ours, no lock
 * (oneDNN 2.6's execute allocates its own argument map inside). One call site's function is not to be called from two threads at once (like any kernel
 * with state).
 */
#ifndef TVM_HETERO_BACKENDS_DNNL_REGION_H_
#define TVM_HETERO_BACKENDS_DNNL_REGION_H_

#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace tvm_hetero {
namespace dnnl_backend {

/*!
 * \brief How a step computes in integers (QDQ units, docs/byoc.md "int8"): its source is the data
 *        type the value it reads has (u8 or s8), weights are s8 and a bias s32 in the accumulator's
 *        units; the accumulator times `scales` (one, or one per output channel) plus
 *        `dst_zero_point` is rounded to nearest even and saturated to `dst_type`. A `quantize` step
 *        is `round(x / scales[0]) + dst_zero_point` (ONNX's order), a `dequantize` step `(x - src_zero_point) * scales[0]`.
 *        Pooling in integers is `pool(x) * scales[0] + shift` (the zero points folded into `shift`);
 *        a concat's input i is requantized to the output as `(x - src_zero_points[i]) * scales[i] +
 *        dst_zero_point`; a scale_shift in integers reads u8/s8 data and float per-channel vectors
 *        already in the output's units (zero points folded in by the compiler).
 */
struct QuantSpec {
  /*! \brief Whether the step is quantized at all (the field was present). */
  bool on = false;
  /*! \brief The output's data type: "u8", "s8" or "f32". */
  std::string dst_type = "f32";
  /*! \brief Output scales: one for the whole tensor, or one per output channel. */
  std::vector<float> scales;
  /*! \brief Zero points of the source (subtracted) and of the output (added). */
  int32_t src_zero_point = 0, dst_zero_point = 0;
  /*! \brief add: added to `scales[0] * a + scales[1] * b` before the activation (the sources' zero
   *         points, folded). */
  float shift = 0.f;
  /*! \brief concat: each input's zero point (subtracted before its scale). */
  std::vector<int32_t> src_zero_points;
};

/*!
 * \brief One oneDNN primitive of a region, with its fused post-ops. Argument roles are value
 *        ids of the region: 0 .. num_inputs-1 are the call's inputs, num_inputs + k is step k's
 *        output (the last step's output is the call's output).
 */
struct StepSpec {
  /*! \brief "conv2d", "matmul", "max_pool2d", "avg_pool2d", "channel_shuffle", "softmax",
   *         "layer_norm" (over the last axis; weight and bias are its scale and shift) or
   *         "concat" (of `inputs` along `axis`, then `relu` if set), "lrn" (across channels:
   *         `local_size`, `alpha`, `beta`, `k`) or "scale_shift" (data * weight + bias per channel
   *         of an NCHW tensor, then the activations) or "batch_matmul" (`inputs` a @ b, rank 3-4,
   *         equal batch dims), or "quantize" / "dequantize" (a reorder with `quant`'s scale and
   *         zero points, in the layout its input has), or "add" (`inputs` a + b, quantized:
   *         ResNet's residual), or "int8_weight_matmul" (data @ dequantize(weight)ᵀ + bias: the weight
   *         (N, K) uint8 less the uint8 `zero_point`, times `scale`, one float per output; our VNNI kernel,
   *         backends/int8_matmul.h). */
  std::string op;
  /*! \brief conv2d / matmul in integers, and the parameters of quantize / dequantize. */
  QuantSpec quant;
  /*! \brief Value id of the data, the weight, the bias and the residual (-1: none). */
  int data = 0, weight = -1, bias = -1, residual = -1;
  /*! \brief int8_weight_matmul: value ids of the per-output weight scales and of the zero point (-1: none). */
  int scale = -1, zero_point = -1;
  /*! \brief concat: the value ids joined, in order; batch_matmul: its two operands. */
  std::vector<int> inputs;
  /*! \brief Shape of the step's output (empty: the call's output tensor's, last step only). */
  std::vector<int64_t> shape;
  /*! \brief ReLU after everything else. */
  bool relu = false;
  /*! \brief Another activation after everything else (empty: none): "clip" (alpha, beta = min, max),
   *         "sigmoid", "hardswish", "gelu", "gelu_tanh" or "silu". */
  std::string activation;
  float alpha = 0.f, beta = 0.f;
  /*! \brief matmul: the weight is stored (N, K) (ONNX Gemm transB), not (K, N). */
  bool weight_transposed = false;
  /*! \brief matmul: the weight is stored in panels of (K, N)'s columns, (N / w, K, w) for this width
   *         w (one_row_matmul.h's layout; oneDNN's BA16a16b for w = 16); 0: not in panels. */
  int64_t weight_panels = 0;
  /*! \brief avg_pool2d: padded elements count in the average. */
  bool count_include_pad = false;
  /*! \brief conv2d / pooling attributes, Relax conventions (padding is top, left, bottom, right). */
  std::vector<int64_t> strides, padding, dilation, pool_size;
  /*! \brief softmax and concat: the axis (non-negative). */
  int64_t axis = -1;
  /*! \brief layer_norm: the epsilon added to the variance. */
  float epsilon = 1e-5f;
  /*! \brief conv2d groups; channel_shuffle: the number of groups. */
  int64_t groups = 1;
  /*! \brief lrn: the window (channels, odd) and the constant added before the power. */
  int64_t local_size = 1;
  float k = 1.f;
};

/*!
 * \brief One region as the compiler describes it: a chain (in general a DAG, in order) of steps
 *        whose intermediate values never leave the region, so they stay in oneDNN's layouts.
 */
struct RegionSpec {
  /*! \brief The symbol the graph's func_name uses. */
  std::string name;
  /*! \brief Number of inputs of the call (the output follows them). */
  int num_inputs = 1;
  /*! \brief The primitives, in an order where every value is made before it is read. */
  std::vector<StepSpec> steps;
};

/*! \brief The document the compiler writes: every region, by name. */
std::vector<RegionSpec> ParseRegions(const std::string& json_text);

/*! \brief Whether this library was built with oneDNN. */
bool DnnlAvailable();

class RegionExec;

/*! \brief Runs the regions of one graph; binary-serializable, so export_library packs it. */
class WeightCache;

class DnnlRegionModule : public tvm::ffi::ModuleObj {
 public:
  explicit DnnlRegionModule(std::string json_text);
  ~DnnlRegionModule();

  const char* kind() const final { return "tvm_hetero_dnnl"; }
  int GetPropertyMask() const final {
    return tvm::ffi::Module::kBinarySerializable | tvm::ffi::Module::kRunnable;
  }
  tvm::ffi::Optional<tvm::ffi::Function> GetFunction(const tvm::ffi::String& name) final;
  tvm::ffi::Bytes SaveToBytes() const final;
  tvm::ffi::String InspectSource(const tvm::ffi::String& format) const final { return json_text_; }

 private:
  /*! \brief The compiler's document, saved verbatim. */
  std::string json_text_;
  /*! \brief Every region, by name. */
  std::unordered_map<std::string, RegionSpec> regions_;
  /*! \brief Bumped when parameter values change; executors re-reorder their weights when it moves. */
  std::shared_ptr<std::atomic<uint64_t>> weights_generation_ = std::make_shared<std::atomic<uint64_t>>(0);
  /*! \brief Weights reordered for the primitives, shared by the call sites that read them alike. */
  std::shared_ptr<WeightCache> weight_cache_;
};

}  // namespace dnnl_backend
}  // namespace tvm_hetero

#endif  // TVM_HETERO_BACKENDS_DNNL_REGION_H_

/*!
 * \file tvm_hetero/backends/dnnl_region.h
 * \brief The oneDNN backend's regions: what the compiler writes for each (`RegionSpec`) and the
 *        module that runs them (`DnnlRegionModule`, kind "tvm_hetero_dnnl").
 *
 * A region is one oneDNN primitive with its fused post-ops (bias, residual sum, ReLU). The
 * compiler describes every region of a graph in one JSON document (docs/byoc.md); the module
 * holds that text, serializes it with SaveToBytes, and is rebuilt from it by the loader
 * `ffi.Module.load_from_bytes.tvm_hetero_dnnl`. Weights are graph parameters, passed to the
 * region like any kernel argument, so the module holds no tensors. Every GetFunction returns a
 * fresh executor for one call site (the graph runtime asks once per node): its primitive,
 * reorders and argument maps are built on its first call, from the shapes of its arguments, and
 * later calls only point memories at the arguments and execute -- no allocation, no lock. One
 * call site's function is not to be called from two threads at once (like any kernel with state).
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

/*! \brief One region as the compiler describes it; argument roles index the call's inputs. */
struct RegionSpec {
  /*! \brief The symbol the graph's func_name uses. */
  std::string name;
  /*! \brief "conv2d", "matmul", "max_pool2d", "avg_pool2d", "channel_shuffle", "softmax" or
   *         "layer_norm" (over the last axis; weight and bias are its scale and shift). */
  std::string op;
  /*! \brief Number of inputs of the call (the output follows them). */
  int num_inputs = 1;
  /*! \brief Input index of the data, the weight, the bias and the residual (-1: none). */
  int data = 0, weight = -1, bias = -1, residual = -1;
  /*! \brief ReLU after everything else. */
  bool relu = false;
  /*! \brief Another activation after everything else (empty: none): "clip" (alpha, beta = min, max),
   *         "sigmoid", "hardswish", "gelu", "gelu_tanh" or "silu". */
  std::string activation;
  float alpha = 0.f, beta = 0.f;
  /*! \brief matmul: the weight is stored (N, K) (ONNX Gemm transB), not (K, N). */
  bool weight_transposed = false;
  /*! \brief avg_pool2d: padded elements count in the average. */
  bool count_include_pad = false;
  /*! \brief conv2d / pooling attributes, Relax conventions (padding is top, left, bottom, right). */
  std::vector<int64_t> strides, padding, dilation, pool_size;
  /*! \brief softmax: the axis (non-negative). */
  int64_t axis = -1;
  /*! \brief layer_norm: the epsilon added to the variance. */
  float epsilon = 1e-5f;
  /*! \brief conv2d groups; channel_shuffle: the number of groups. */
  int64_t groups = 1;
};

/*! \brief The document the compiler writes: every region, by name. */
std::vector<RegionSpec> ParseRegions(const std::string& json_text);

/*! \brief Whether this library was built with oneDNN. */
bool DnnlAvailable();

class RegionExec;

/*! \brief Runs the regions of one graph; binary-serializable, so export_library packs it. */
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
};

}  // namespace dnnl_backend
}  // namespace tvm_hetero

#endif  // TVM_HETERO_BACKENDS_DNNL_REGION_H_

/*!
 * \file dnnl_region_allocation_test.cc
 * \brief A graph of oneDNN regions allocates nothing of its own on its second and later runs: this
 *        binary replaces operator new and interposes malloc, calloc, realloc and the aligned
 *        allocators (forwarding to glibc's) to count every heap allocation of the process, and
 *        interposes oneDNN's dnnl_primitive_execute to tell apart what oneDNN 2.6 allocates inside it
 *        (it converts the argument array into a hash map on every execution; nothing a caller can
 *        avoid through the public API) from everything else.
 */
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm_hetero/backends/dnnl_region.h>
#include <tvm_hetero/graph_runtime.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <new>
#include <string>
#include <vector>

/*! \brief Heap allocations of this process (operator new and the C allocators) outside oneDNN's
 *         primitive execution, and inside it. */
static std::atomic<int64_t> g_allocations{0}, g_inside_execute{0};
/*! \brief Whether this thread is inside dnnl_primitive_execute. */
static thread_local bool t_in_execute = false;

static void CountAllocation() { (t_in_execute ? g_inside_execute : g_allocations).fetch_add(1, std::memory_order_relaxed); }

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);

void* malloc(size_t size) {
  CountAllocation();
  return __libc_malloc(size);
}
void* calloc(size_t n, size_t size) {
  CountAllocation();
  return __libc_calloc(n, size);
}
void* realloc(void* p, size_t size) {
  CountAllocation();
  return __libc_realloc(p, size);
}
void* memalign(size_t alignment, size_t size) {
  CountAllocation();
  return __libc_memalign(alignment, size);
}
void* aligned_alloc(size_t alignment, size_t size) { return memalign(alignment, size); }
int posix_memalign(void** out, size_t alignment, size_t size) {
  void* p = memalign(alignment, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

dnnl_status_t dnnl_primitive_execute(const_dnnl_primitive_t primitive, dnnl_stream_t stream, int nargs,
                                     const dnnl_exec_arg_t* args) {
  using Fn = dnnl_status_t (*)(const_dnnl_primitive_t, dnnl_stream_t, int, const dnnl_exec_arg_t*);
  static Fn next = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "dnnl_primitive_execute"));
  bool outer = t_in_execute;
  t_in_execute = true;
  dnnl_status_t status = next(primitive, stream, nargs, args);
  t_in_execute = outer;
  return status;
}
}

void* operator new(std::size_t size) {
  CountAllocation();
  if (void* p = __libc_malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace tvm_hetero {
namespace {

namespace ffi = tvm::ffi;

/*!
 * \brief Regions side by side: a conv2d + bias + ReLU (blocked layouts: reorders in and out,
 *        weights reordered once) followed by a 2-D max pool, a four-row matmul + bias, a one-row
 *        matmul on an (N, K) weight (oneDNN's inner product), a one-row matmul on a (K, N) weight (our
 *        kernel on the stored weights, a decode step's projection), and 8-bit weight matmuls of one
 *        and three rows (our VNNI kernel; its OpenMP team and the rows' quantization).
 */
const char* kRegions = R"({"format": "tvm-hetero-dnnl/1", "regions": [
  {"name": "conv_pool", "op": "block", "num_inputs": 3, "steps": [
    {"op": "conv2d", "args": [0, 1, 2], "data": 0, "weight": 1, "bias": 2, "relu": true, "strides": [1, 1],
     "padding": [1, 1, 1, 1], "dilation": [1, 1], "shape": [1, 16, 14, 14]},
    {"op": "max_pool2d", "args": [3], "data": 0, "strides": [2, 2], "padding": [0, 0, 0, 0],
     "dilation": [1, 1], "pool_size": [2, 2], "shape": [1, 16, 7, 7]}]},
  {"name": "rows", "op": "matmul", "num_inputs": 3, "data": 0, "weight": 1, "bias": 2},
  {"name": "one_row", "op": "matmul", "num_inputs": 2, "data": 0, "weight": 1, "weight_transposed": true},
  {"name": "one_row_stored", "op": "matmul", "num_inputs": 2, "data": 0, "weight": 1},
  {"name": "int8_one", "op": "int8_weight_matmul", "num_inputs": 4, "data": 0, "weight": 1, "scale": 2,
   "zero_point": 3},
  {"name": "int8_rows", "op": "int8_weight_matmul", "num_inputs": 4, "data": 0, "weight": 1, "scale": 2,
   "zero_point": 3}
]})";

/*! \brief The graph: inputs x, conv weight and bias, a, matmul weight and bias, v, its weights (N, K)
 *         and (K, N), the 8-bit weight, its scales and zero point, and three rows qx. */
const char* kGraph = R"({"nodes": [
  {"op": "null", "name": "x", "inputs": []},
  {"op": "null", "name": "cw", "inputs": []},
  {"op": "null", "name": "cb", "inputs": []},
  {"op": "null", "name": "a", "inputs": []},
  {"op": "null", "name": "mw", "inputs": []},
  {"op": "null", "name": "mb", "inputs": []},
  {"op": "null", "name": "v", "inputs": []},
  {"op": "null", "name": "vw", "inputs": []},
  {"op": "tvm_op", "name": "conv_pool", "inputs": [[0, 0, 0], [1, 0, 0], [2, 0, 0]],
   "attrs": {"func_name": "conv_pool", "num_inputs": "3", "num_outputs": "1", "flatten_data": "0"}},
  {"op": "tvm_op", "name": "rows", "inputs": [[3, 0, 0], [4, 0, 0], [5, 0, 0]],
   "attrs": {"func_name": "rows", "num_inputs": "3", "num_outputs": "1", "flatten_data": "0"}},
  {"op": "tvm_op", "name": "one_row", "inputs": [[6, 0, 0], [7, 0, 0]],
   "attrs": {"func_name": "one_row", "num_inputs": "2", "num_outputs": "1", "flatten_data": "0"}},
  {"op": "null", "name": "sw", "inputs": []},
  {"op": "null", "name": "qw", "inputs": []},
  {"op": "null", "name": "qs", "inputs": []},
  {"op": "null", "name": "qz", "inputs": []},
  {"op": "null", "name": "qx", "inputs": []},
  {"op": "tvm_op", "name": "one_row_stored", "inputs": [[6, 0, 0], [11, 0, 0]],
   "attrs": {"func_name": "one_row_stored", "num_inputs": "2", "num_outputs": "1", "flatten_data": "0"}},
  {"op": "tvm_op", "name": "int8_one", "inputs": [[6, 0, 0], [12, 0, 0], [13, 0, 0], [14, 0, 0]],
   "attrs": {"func_name": "int8_one", "num_inputs": "4", "num_outputs": "1", "flatten_data": "0"}},
  {"op": "tvm_op", "name": "int8_rows", "inputs": [[15, 0, 0], [12, 0, 0], [13, 0, 0], [14, 0, 0]],
   "attrs": {"func_name": "int8_rows", "num_inputs": "4", "num_outputs": "1", "flatten_data": "0"}}],
  "arg_nodes": [0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 14, 15],
  "node_row_ptr": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
  "heads": [[8, 0, 0], [9, 0, 0], [10, 0, 0], [16, 0, 0], [17, 0, 0], [18, 0, 0]],
  "attrs": {"shape": ["list_shape", [[1, 3, 14, 14], [16, 3, 3, 3], [16], [4, 64], [64, 96], [1, 96],
                                     [1, 256], [512, 256], [1, 16, 7, 7], [4, 96], [1, 512],
                                     [256, 128], [64, 256], [64], [1], [3, 256], [1, 128], [1, 64], [3, 64]]],
            "dltype": ["list_str", ["float32", "float32", "float32", "float32", "float32", "float32",
                                    "float32", "float32", "float32", "float32", "float32", "float32",
                                    "uint8", "float32", "uint8", "float32", "float32", "float32", "float32"]],
            "storage_id": ["list_int", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]],
            "device_index": ["list_int", [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]]}})";

/*! \brief Sets every input of `rt` to small varied values. */
void FillInputs(GraphRuntime& rt) {
  const char* names[] = {"x", "cw", "cb", "a", "mw", "mb", "v", "vw", "sw", "qs", "qx", "qw", "qz"};
  std::vector<std::vector<int64_t>> shapes = {{1, 3, 14, 14}, {16, 3, 3, 3}, {16},     {4, 64},    {64, 96},
                                              {1, 96},        {1, 256},      {512, 256}, {256, 128}, {64},
                                              {3, 256},       {64, 256},     {1}};
  const size_t num_float = 11;  // then the uint8 weight and zero point
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : shapes[i]) n *= d;
    std::vector<float> values(n);
    std::vector<uint8_t> bytes(n);
    for (int64_t j = 0; j < n; ++j) values[j] = static_cast<float>((j * 7 + static_cast<int64_t>(i)) % 13) / 13.f - 0.5f;
    for (int64_t j = 0; j < n; ++j) bytes[j] = static_cast<uint8_t>((j * 37 + 11) % 256);
    bool is_float = i < num_float;
    DLTensor t{is_float ? static_cast<void*>(values.data()) : bytes.data(), {kDLCPU, 0},
               static_cast<int32_t>(shapes[i].size()),
               is_float ? DLDataType{kDLFloat, 32, 1} : DLDataType{kDLUInt, 8, 1}, shapes[i].data(), nullptr, 0};
    rt.SetInput(rt.GetInputIndex(names[i]), &t);
  }
}

TEST(DnnlRegionAllocation, RunsAfterTheFirstAllocateNothingOutsideOneDnnsExecute) {
  if (!dnnl_backend::DnnlAvailable()) GTEST_SKIP() << "built without oneDNN";
  ffi::Module regions = ffi::Function::GetGlobalRequired("tvm_hetero.dnnl.create_module")(ffi::String(kRegions))
                            .cast<ffi::Module>();
  GraphRuntime rt;
  rt.Init(kGraph, regions, {{kDLCPU, 0}});
  FillInputs(rt);
  rt.Run();  // the first run sets every region up
  for (int run = 2; run <= 5; ++run) {
    int64_t before = g_allocations.load(), inside = g_inside_execute.load();
    rt.Run();
    EXPECT_EQ(g_allocations.load() - before, 0) << "heap allocations during run " << run;
    if (run == 5) {
      std::cout << "allocations inside oneDNN's dnnl_primitive_execute per run: " << g_inside_execute.load() - inside << "\n";
    }
  }
}

}  // namespace
}  // namespace tvm_hetero

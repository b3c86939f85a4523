/*!
 * \file plan/execution_plan.h
 * \brief The immutable plan of one graph on its devices: one list of steps (kernel, copy, nop, or an
 *        offloaded group owning its sub-steps), each with its node, the executor device that runs it,
 *        its arguments as tensor ids, and the memory it reads and writes.
 *
 * A plan holds no memory and no per-run state: tensor ids name a frame's tensors (plan/run_frame.h),
 * so any number of frames run one plan at once. It is made by BuildPlan (plan_build.cc) and changed
 * only by plan -> plan passes: InsertDeviceCrossings (plan_crossings.cc), FormOffloadSegments and
 * AttachOffloadRunner (plan_offload.cc). Each pass is a pure function, testable on a hand-made graph.
 */
#ifndef TVM_HETERO_PLAN_EXECUTION_PLAN_H_
#define TVM_HETERO_PLAN_EXECUTION_PLAN_H_

#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>
#include <tvm_hetero/graph.h>
#include <tvm_hetero/graph_runtime.h>
#include <tvm_hetero/storage_plan.h>

#include <cstdint>
#include <string>
#include <vector>

#include "concurrency/step_schedule.h"

namespace tvm_hetero {

/*! \brief Where a frame finds the memory of one tensor id. */
struct PlanTensor {
  enum class Source : uint8_t {
    /*! \brief Graph entry `entry`: a view into its pool slot. */
    kEntry,
    /*! \brief Entry `entry`'s bytes carrying device `device` (devices sharing memory). */
    kSharedView,
    /*! \brief A buffer of its own on `device`, filled by an implicit copy of `entry`. */
    kCopyBuffer,
  };
  Source source = Source::kEntry;
  /*! \brief The graph entry whose value the tensor holds. */
  uint32_t entry = 0;
  /*! \brief Device position the tensor is on. */
  int device = 0;
};

/*! \brief One step of a plan. */
struct PlanStep {
  enum class Kind : uint8_t { kKernel, kCopy, kNop, kOffloadGroup };
  Kind kind = Kind::kNop;
  /*! \brief Node executed (an implicit copy: its first reader; a group: its first step's node). */
  uint32_t node = 0;
  /*! \brief Device position of the executor that runs the step. */
  int device = 0;
  /*! \brief kKernel: the kernel. kOffloadGroup: the remote runner's run_segment. */
  tvm::ffi::Function function;
  /*! \brief kKernel: tensor ids of the inputs, then the outputs. kCopy: {from, to}. */
  std::vector<uint32_t> args;
  /*! \brief kCopy: a host staging buffer goes between (no single device API copies it). */
  bool staged = false;
  /*! \brief The step talks to another process (a remote kernel, group or copy). */
  bool remote = false;
  /*! \brief Memory read and written (slots numbered as ExecutionPlan::num_slots says). */
  std::vector<MemoryRegion> reads, writes;
  /*! \brief kOffloadGroup: the segment it runs (ExecutionPlan::segments). */
  int32_t segment = -1;
  /*! \brief Position of the step (a group: of its first sub-step) in the plan before runners were
   *         attached; ExecutionPlan::groups index that list. */
  uint32_t origin = 0;
};

/*!
 * \brief A run of steps on one remote device that one call can execute, with the host -> device
 *        copies it carries in and the device -> host copies it carries back (plan_offload.cc).
 */
struct OffloadSegment {
  int device = 0;
  /*! \brief The segment's index among its device's segments (the remote runner's numbering). */
  int64_t index = 0;
  /*! \brief Steps [begin, end) before a runner is attached (kernels and input copies). */
  uint32_t begin = 0, end = 0;
  /*! \brief Input copies (step positions before attaching), applied in this order. */
  std::vector<uint32_t> inputs;
  /*! \brief Output copies (step positions before attaching, at or after `end`). */
  std::vector<uint32_t> outputs;
  /*! \brief Once attached: the steps the group call replaced, in order (kernels and inputs), then
   *         the outputs. Empty before. */
  std::vector<PlanStep> sub_steps;
  /*! \brief Once attached: how many of sub_steps precede the outputs. */
  uint32_t num_body_steps = 0;
  bool attached = false;
};

/*! \brief The plan. Immutable once built: passes return a new plan. */
struct ExecutionPlan {
  /*! \brief Every tensor a step names; ids [0, num_entries) are the graph's entries. */
  std::vector<PlanTensor> tensors;
  uint32_t num_entries = 0;
  /*! \brief Tensor ids of implicit copy buffers, in creation order (GetEntry numbers them after the
   *         entries). */
  std::vector<uint32_t> copy_buffers;
  /*! \brief The steps, in serial order. */
  std::vector<PlanStep> steps;
  /*! \brief Runs of consecutive steps on one device (positions before runners were attached). */
  std::vector<ExecGroup> groups;
  /*! \brief Remote segments (FormOffloadSegments), attached or not. */
  std::vector<OffloadSegment> segments;
  /*! \brief Pool slots of the storage plan; copy buffer k is slot num_pool_slots + k. */
  uint32_t num_pool_slots = 0;
  /*! \brief Bytes moved by copy steps per run (graph copies and implicit ones). */
  int64_t bytes_copied_per_run = 0;
  /*! \brief Kernel arguments reading an entry through a shared view (an edge costing a wait). */
  int64_t num_shared_views = 0;

  /*! \brief One line per step: position, kind, node, device, arguments, reads and writes. */
  std::string ToString(const Graph& graph) const;
};

/*! \brief What BuildPlan reads: the graph, its devices and libraries, and its storage. */
struct PlanInputs {
  const Graph* graph = nullptr;
  std::vector<DLDevice> devices;
  /*! \brief Device position of each node. */
  std::vector<int> node_device;
  const StoragePlan* storage = nullptr;
  /*! \brief Kernel library. */
  tvm::ffi::Optional<tvm::ffi::Module> lib;
  /*! \brief Per-device libraries overriding lib (unset: lib). */
  std::vector<tvm::ffi::Optional<tvm::ffi::Module>> device_libs;
};

/*!
 * \brief The plan of the graph as written: one step per non-input node in node order, kernel
 *        arguments naming entries directly (some may sit on another device: InsertDeviceCrossings
 *        fixes that). Throws naming the node for a kernel missing from its library.
 */
ExecutionPlan BuildPlan(const PlanInputs& in);

/*!
 * \brief Kernel arguments on a device other than the kernel's: a shared view where the devices
 *        share memory (a wait, no copy), else one implicit copy per (entry, device), inserted just
 *        before its first reader. Then groups are formed. Guarantee: every kernel argument is a
 *        tensor on the kernel's device, and a copy precedes every reader of its buffer.
 */
ExecutionPlan InsertDeviceCrossings(ExecutionPlan plan, const PlanInputs& in);

/*! \brief Remote segments and the copies they may carry (see plan_offload.cc for the guarantee). */
ExecutionPlan FormOffloadSegments(ExecutionPlan plan, const std::vector<DLDevice>& devices);

/*!
 * \brief Every segment of `device` becomes one kOffloadGroup step calling `run_segment(index, input
 *        bytes...)` at the segment's first position; the steps it replaces (and the outputs it
 *        carries) become its sub-steps, its reads and writes their union.
 */
ExecutionPlan AttachOffloadRunner(ExecutionPlan plan, int device, tvm::ffi::Function run_segment);

/*!
 * \brief Node `nid`'s kernel from its device's library (throws naming the node when missing). Each
 *        call gives a call site of its own: some libraries keep per-call-site state (a oneDNN
 *        region's memories), so every frame asks for its own.
 */
tvm::ffi::Function FindKernel(const PlanInputs& in, uint32_t nid);

/*! \brief Tensor id -> GetEntry number (entries, then copy buffers), or -1 for a shared view. */
int64_t EntryNumber(const ExecutionPlan& plan, uint32_t tensor);

}  // namespace tvm_hetero

#endif  // TVM_HETERO_PLAN_EXECUTION_PLAN_H_

/*!
 * \file tvm_hetero/execution.h
 * \brief How a runtime executes its devices: one after another, or at the same time with an
 *        executor per device (a CPU cluster: pinned cores and its own thread pool).
 */
#ifndef TVM_HETERO_EXECUTION_H_
#define TVM_HETERO_EXECUTION_H_

#include <string>
#include <vector>

namespace tvm_hetero {

enum class ExecutionMode {
  /*! \brief Devices run one after another in graph order: on the calling thread, except that a
   *         device with ExecutorOptions runs its steps on its own executor (its cores and thread
   *         counts hold in both modes). */
  kSerial,
  /*! \brief Each device runs its own steps on its own executor; cross-device waits keep the
   *         serial result (src/concurrency/step_schedule.h). */
  kConcurrent,
};

/*! \brief How one device's executor runs (a CPU cluster: its cores and its TVM thread pool size). */
struct ExecutorOptions {
  /*! \brief Cores the executor thread (and its thread pool) may run on; empty: no pinning. */
  std::vector<int> cores;
  /*! \brief TVM thread-pool threads, and the OpenMP team (oneDNN), for kernels run by this
   *         executor; 0: the defaults. */
  int num_threads = 0;

  bool empty() const { return cores.empty() && num_threads == 0; }
};

/*! \brief Whether any device has options (so that its steps need an executor of their own). */
bool HasExecutorOptions(const std::vector<ExecutorOptions>& options);

/*! \brief "serial" or "concurrent"; throws naming the value otherwise. */
ExecutionMode ParseExecutionMode(const std::string& name);

/*!
 * \brief Per-device options from JSON: a list (one entry per device, null for none) of objects
 *        {"cores": [int...], "num_threads": int}. Throws naming the device and field at fault.
 */
std::vector<ExecutorOptions> ParseExecutorOptions(const std::string& json, int num_devices);

}  // namespace tvm_hetero

#endif  // TVM_HETERO_EXECUTION_H_

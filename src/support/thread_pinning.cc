/*!
 * \file support/thread_pinning.cc
 * \brief Thread affinity plus TVM and OpenMP pool sizes for one thread.
 */
#include "support/thread_pinning.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include "support/tensor_check.h"

#include <cerrno>
#include <cstring>
#include <sstream>
#include <string>

namespace tvm_hetero {
namespace support {

namespace ffi = tvm::ffi;

namespace {
// runtime.config_threadpool affinity modes.
constexpr int kTvmDefaultAffinity = 0;
constexpr int kTvmOneCorePerThread = -2;
constexpr int kTvmShareAllCores = -3;

std::string CoreList(const std::vector<int>& cores) {
  std::ostringstream os;
  for (size_t i = 0; i < cores.size(); ++i) os << (i ? ", " : "") << cores[i];
  return os.str();
}
}  // namespace

void ConfigureCurrentThread(const std::vector<int>& cores, int num_threads, CoreSharing sharing) {
  if (cores.empty() && num_threads <= 0) return;
  static const ffi::Optional<ffi::Function> config = ffi::Function::GetGlobal("runtime.config_threadpool");
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (!cores.empty()) {
    for (int core : cores) CPU_SET(core, &mask);
    if (pthread_setaffinity_np(pthread_self(), sizeof(mask), &mask) != 0) {
      TVM_FFI_THROW(RuntimeError) << "cannot pin the thread to cores [" << CoreList(cores) << "]: " << std::strerror(errno);
    }
  } else if (sharing == CoreSharing::kShareAllCores &&
             pthread_getaffinity_np(pthread_self(), sizeof(mask), &mask) != 0) {
    TVM_FFI_THROW(RuntimeError) << "reading the thread's affinity failed: " << std::strerror(errno);
  }
  if (config.has_value()) {
    if (cores.empty() && sharing == CoreSharing::kOneCorePerThread) {
      (*config)(kTvmDefaultAffinity, num_threads);
    } else {
      // The pool's threads are placed on the cores this thread may now use.
      ffi::Array<ffi::String> cpus;
      for (int core = 0; core < CPU_SETSIZE; ++core) {
        if (CPU_ISSET(core, &mask)) cpus.push_back(ffi::String(std::to_string(core)));
      }
      int threads = num_threads > 0 ? num_threads : static_cast<int>(cores.size());
      (*config)(sharing == CoreSharing::kOneCorePerThread ? kTvmOneCorePerThread : kTvmShareAllCores, threads, cpus);
    }
  }
  // External libraries parallelised with OpenMP (oneDNN) take the same thread count, per thread;
  // cores without a count mean one thread per core (an OpenMP team as wide as the machine on one
  // core would time-slice every oneDNN call).
  const int team = num_threads > 0 ? num_threads : static_cast<int>(cores.size());
  if (team > 0) {
    using SetNumThreads = void (*)(int);
    if (auto set = reinterpret_cast<SetNumThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) set(team);
  }
}

int OpenMPMaxThreads() {
  using GetMaxThreads = int (*)();
  static const auto get = reinterpret_cast<GetMaxThreads>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  return get != nullptr ? get() : 0;
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  // configure_current_thread(cores, num_threads, share_all_cores): ConfigureCurrentThread from Python
  // (a pipeline stage's measuring thread is set up exactly as the C++ worker).
  refl::GlobalDef().def("tvm_hetero.support.configure_current_thread",
                        [](ffi::Array<int64_t> cores, int num_threads, bool share_all_cores) {
                          std::vector<int> list(cores.begin(), cores.end());
                          ConfigureCurrentThread(list, num_threads,
                                                 share_all_cores ? CoreSharing::kShareAllCores : CoreSharing::kOneCorePerThread);
                        });
  // record_thread_config(out): out (int32[2]) = the calling thread's OpenMP team size and TVM pool
  // size. A kernel calls it (T.call_packed) to show the threads a device's steps really run with.
  refl::GlobalDef().def("tvm_hetero.support.record_thread_config", [](DLTensor* out) {
    CheckTensor(out, {2}, DLDataType{kDLInt, 32, 1}, "record_thread_config: out");
    static const ffi::Optional<ffi::Function> pool_size = ffi::Function::GetGlobal("runtime.NumThreads");
    auto* values = reinterpret_cast<int32_t*>(static_cast<char*>(out->data) + out->byte_offset);
    values[0] = OpenMPMaxThreads();
    values[1] = pool_size.has_value() ? (*pool_size)().cast<int32_t>() : 0;
  });
}

}  // namespace support
}  // namespace tvm_hetero

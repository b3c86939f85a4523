/*!
 * \file support/thread_pinning.h
 * \brief Pin the calling thread to cores and size the thread pools it drives (TVM's and OpenMP's),
 *        for device executors and pipeline workers alike.
 */
#ifndef TVM_HETERO_SUPPORT_THREAD_PINNING_H_
#define TVM_HETERO_SUPPORT_THREAD_PINNING_H_

#include <vector>

namespace tvm_hetero {
namespace support {

/*! \brief How the TVM pool threads of a pinned thread use its cores. */
enum class CoreSharing {
  /*! \brief One pool thread per listed core (a device executor's CPU cluster). */
  kOneCorePerThread,
  /*! \brief Every pool thread may run on any listed core (a pipeline stage). */
  kShareAllCores,
};

/*!
 * \brief Configure the calling thread: pin it to `cores` (none: leave its affinity), give its TVM
 *        thread pool `num_threads` threads (0: as many as cores, or TVM's default when no cores)
 *        and the same OpenMP thread count for libraries it calls (oneDNN). This is the one place
 *        the default lives: `{"cores": [...]}` alone means `num_threads` = the number of cores.
 *        Nothing to do when both are empty/zero. Throws RuntimeError naming the cores on failure.
 */
void ConfigureCurrentThread(const std::vector<int>& cores, int num_threads, CoreSharing sharing);

/*!
 * \brief The OpenMP team size the calling thread's next parallel region gets (what oneDNN uses
 *        from this thread); 0 when no OpenMP runtime is loaded in the process.
 */
int OpenMPMaxThreads();

}  // namespace support
}  // namespace tvm_hetero

#endif  // TVM_HETERO_SUPPORT_THREAD_PINNING_H_

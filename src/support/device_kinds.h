/*!
 * \file support/device_kinds.h
 * \brief One trait record per device kind: everything the runtime decides from a DLDevice's type
 *        lives here, and nowhere else compares `device_type`.
 *
 * A kind says whether it is remote (another process, over TVM RPC), whether a call on it returns
 * before its work is done (asynchronous), where its tensors live (plain host memory of this process,
 * or memory of its own), whether a storage offset can be added to its data pointers, how to wait
 * for it, and whether compiled TVM kernels run on it (an NPU driven through its vendor runtime runs
 * only the vendor's graphs).
 *
 * Lookup rule, written once: a device type at or above kRPCSessMask is the remote kind whatever the
 * type under the mask; otherwise the record registered for the type; otherwise the conservative
 * "other" record (asynchronous, own memory, no offsets).
 *
 * Ordering rule between a kind's work and its readers: work issued to one device runs in issue order.
 * For an asynchronous kind a call returns at the launch, so before another device (or a clock) may
 * read what it wrote, WaitForCompletion(dev) must return; for a synchronous kind (host CPUs, remote
 * calls, which answer when done, an NPU whose graph execution blocks) the return of the call is the
 * completion.
 *
 * Adding a kind is two entries: one record in kKinds (device_kinds.cc) and one in
 * python/tvm_hetero/devices.py (its default target and how it is discovered).
 */
#ifndef TVM_HETERO_SUPPORT_DEVICE_KINDS_H_
#define TVM_HETERO_SUPPORT_DEVICE_KINDS_H_

#include <dlpack/dlpack.h>

#include <string>
#include <vector>

namespace tvm_hetero {
namespace support {

/*! \brief TVM's RPC session mask: device types at or above it live in another process. */
inline constexpr int kRPCSessMask = 128;

/*! \brief How to wait until work issued to a device is done. */
enum class WaitMode {
  /*! \brief Nothing to wait for: the call that issued the work returned when it was done. */
  kReturn,
  /*! \brief Drain the device's default stream (DeviceAPI::StreamSync). */
  kStreamSync,
};

/*! \brief The facts of one device kind. */
struct DeviceKindTraits {
  /*! \brief Short name, as Python's devices.py knows the kind: "cpu", "cuda", "remote", a vendor's kind. */
  const char* name;
  /*! \brief Lives in another process, reached through a TVM RPC session. */
  bool remote;
  /*! \brief A call returns before the device has finished the work it issued. */
  bool asynchronous;
  /*! \brief Its tensors are plain host memory of this process: allocated on the host, and read in
   *         place by every other local kind with host memory (CPUs, an NPU sharing rpcmem). */
  bool host_memory;
  /*! \brief A data pointer plus a byte offset is a valid data pointer (views inside one allocation). */
  bool offsets_usable;
  /*! \brief How to wait for its work (WaitForCompletion). */
  WaitMode wait;
  /*! \brief Compiled TVM kernels run on it (false: only a vendor runtime's graphs). */
  bool runs_tvm_kernels;
};

/*! \brief The record of `dev`'s kind (never null; see the lookup rule above). */
const DeviceKindTraits& TraitsOf(DLDevice dev);
/*! \brief The record registered for a local device type, or nullptr. */
const DeviceKindTraits* RegisteredTraits(int device_type);
/*! \brief Add the record of a kind driven through a vendor runtime (a vendor's package calls it
 *         before any runtime uses the kind): its device type, name, whether its tensors are host
 *         memory, whether TVM kernels run on it. Registering the same record again is a no-op;
 *         another record for a known device type is an error. */
void RegisterDeviceKind(int device_type, const std::string& name, bool host_memory, bool runs_tvm_kernels);
/*! \brief The local device types that have a record of their own, in registration order. */
std::vector<int> RegisteredDeviceTypes();

/*! \brief The completion hook: returns once all work issued to `dev` is done (a clock stopped after
 *         it measures the device's work, not its launch). */
void WaitForCompletion(DLDevice dev);

}  // namespace support
}  // namespace tvm_hetero

#endif  // TVM_HETERO_SUPPORT_DEVICE_KINDS_H_

/*!
 * \file support/device.h
 * \brief The one notion of a device the runtime, the pipeline executor, the offload runner and the
 *        oneDNN module share: what kind it is, how to allocate on it, how to copy between two of
 *        them, how to wait for it, and which pairs share memory.
 *
 * What differs between device kinds (remote or not, asynchronous or not, host memory or its own,
 * offsets, how to wait) is read from the kind's record (device_kinds.h); nothing here compares a
 * device type.
 *
 * Ordering contract (everything below is issued on the device's default stream, nullptr):
 *  - Work issued to one device runs in issue order. Kernels, CopyAcrossDevices and SyncDevice on
 *    one device never overtake each other.
 *  - A copy whose destination is the host is complete when CopyAcrossDevices returns (it
 *    synchronises the source device); any other copy is only ordered before later work on the
 *    device whose API performed it (CopyApiDevice), so a reader on the host calls SyncDevice first.
 *  - Between two devices of different kinds, neither of them the host, no single device API can
 *    copy: the copy is staged through a host buffer (NeedsStaging, StagingBuffer), and, by the rule
 *    above, the first half is complete before the second half starts.
 *  - SharesMemory(a, b): a tensor allocated on `a` can be read on `b` in place (both are local kinds
 *    whose tensors are host memory: CPUs of this process, an NPU sharing host buffers). Such edges
 *    need a wait, not a copy; every other crossing needs a copy.
 *  - Nothing here locks: callers order calls on one device (one executor thread per device, one RPC
 *    session per thread).
 */
#ifndef TVM_HETERO_SUPPORT_DEVICE_H_
#define TVM_HETERO_SUPPORT_DEVICE_H_

#include <tvm/ffi/container/tensor.h>

#include "support/device_kinds.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tvm_hetero {
namespace support {

/*! \brief A local device whose tensors are plain host memory of this process (a CPU, an NPU
 *         sharing host buffers): the host can read and write them directly. */
inline bool IsHost(DLDevice dev) {
  const DeviceKindTraits& t = TraitsOf(dev);
  return t.host_memory && !t.remote;
}
/*! \brief A device of another process, reached through a TVM RPC session. */
inline bool IsRemote(DLDevice dev) { return TraitsOf(dev).remote; }
/*! \brief Work issued to `dev` may still run after the call returns (WaitForCompletion waits). */
inline bool IsAsynchronous(DLDevice dev) { return TraitsOf(dev).asynchronous; }
/*! \brief The end of a run must wait for `dev` (its kind has something to wait for). */
inline bool NeedsDrain(DLDevice dev) { return TraitsOf(dev).wait != WaitMode::kReturn; }
inline bool SameDevice(DLDevice a, DLDevice b) { return a.device_type == b.device_type && a.device_id == b.device_id; }
/*! \brief `dev` has the DLDeviceType `type` (legacy graphs name devices by type). */
inline bool HasDeviceType(DLDevice dev, int64_t type) { return static_cast<int64_t>(dev.device_type) == type; }
/*! \brief Both devices are reached through one device API (the same device type). */
inline bool SameKind(DLDevice a, DLDevice b) { return a.device_type == b.device_type; }
/*! \brief Tensors on `a` can be read on `b` in place (both local kinds with host memory). */
inline bool SharesMemory(DLDevice a, DLDevice b) { return IsHost(a) && IsHost(b); }
/*! \brief A tensor on `from` can stand in, without a copy, for one on `to`: the same local device,
 *         or two devices sharing memory (a remote device's tensor is never read in place). */
inline bool ReadableInPlace(DLDevice from, DLDevice to) {
  return SameDevice(from, to) ? !IsRemote(to) : SharesMemory(from, to);
}
/*! \brief True when no single device API copies between these two: a host buffer goes between. */
inline bool NeedsStaging(DLDevice from, DLDevice to) {
  return !SameKind(from, to) && !IsHost(from) && !IsHost(to);
}
/*! \brief The device whose API performs a (non-staged) copy between these two. */
inline DLDevice CopyApiDevice(DLDevice from, DLDevice to) { return IsHost(from) ? to : from; }
/*!
 * \brief Whether a pointer plus a byte offset is a valid data pointer on `dev`: kernels reject a
 *        nonzero DLTensor::byte_offset, so views inside one allocation need this (elsewhere --
 *        OpenCL, Vulkan, Metal handles, remote memory -- storage offsets are kept apart).
 */
inline bool OffsetsUsable(DLDevice dev) { return TraitsOf(dev).offsets_usable; }
/*! \brief "cpu:0", "cuda:1", "remote[0]:cpu:0". */
std::string DeviceName(DLDevice dev);

/*! \brief Kernels and copies write through the DLTensor of a tensor the caller owns. */
inline DLTensor* Mutable(const tvm::ffi::Tensor& t) { return const_cast<DLTensor*>(t.GetDLTensorPtr()); }

/*! \brief A tensor allocated with `device`'s own API (64-byte aligned; at least one byte, so
 *         every tensor has an address). Freeing never throws: a remote device may be gone. */
tvm::ffi::Tensor AllocTensor(tvm::ffi::Shape shape, DLDataType dtype, DLDevice device);
/*! \brief A typed view at `offset` bytes into `base` carrying `device` (which must share memory
 *         with base's, or be base's); the view keeps `base` alive. */
tvm::ffi::Tensor ViewOf(const tvm::ffi::Tensor& base, size_t offset, tvm::ffi::Shape shape, DLDataType dtype,
                        DLDevice device);
/*! \brief The host buffer a copy `from` -> `to` of this shape needs, or an undefined tensor when
 *         NeedsStaging is false. Made once at setup, so the copy itself allocates nothing. */
tvm::ffi::Tensor StagingBuffer(DLDevice from, DLDevice to, tvm::ffi::Shape shape, DLDataType dtype);

/*!
 * \brief Copy between tensors on any two devices (the only copy routine of the library).
 *        `staging` is StagingBuffer(from, to, ...) -- needed only when NeedsStaging.
 */
void CopyAcrossDevices(const DLTensor* from, DLTensor* to, DLTensor* staging = nullptr);
/*! \brief CopyAcrossDevices, allocating a staging buffer for this one copy when needed (setup and
 *         API calls only, never a hot loop). */
void CopyOnce(const DLTensor* from, DLTensor* to);
/*! \brief Wait until all work issued to `dev` is complete (the kind's completion hook). */
inline void SyncDevice(DLDevice dev) { WaitForCompletion(dev); }
/*! \brief Add `dev` to `devices` unless it is there already. */
void AddUnique(std::vector<DLDevice>* devices, DLDevice dev);

}  // namespace support
}  // namespace tvm_hetero

#endif  // TVM_HETERO_SUPPORT_DEVICE_H_

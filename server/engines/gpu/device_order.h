// DeviceOrder: the GPU engine's one lock order for driver calls that touch
// the memory of more than one device (docs/CUDA.md, "Locks and waits: why
// issue cannot deadlock"). A driver may lock each device context a call
// touches - a peer copy issued on device D that reads IPC-mapped memory of
// device P its own context and then P's; an IPC open or close, a portable
// host registration, every context the mapping lives in - so two threads
// making such calls at once can take the same two contexts in opposite
// orders and wait for each other inside the driver (both per-GPU issuers
// blocked in the driver's rwlock, as first seen on two H200s). Every such
// call is therefore made holding this class's locks of every device it
// touches, taken in device index order: two calls that share a device
// never run at once, so the driver's context locks under them cannot form
// a cycle, while calls on disjoint devices (pairs 0-1 and 2-3) still run
// side by side.
//
// For the compiler the set held is one capability, `held_`, at level
// kDeviceOrder of the engine's lock order (lock_order.h): a Hold taken while
// another is held, or under a lock of a later level, does not build (the
// index order within a set is Lock's own).
//
// Threads: any. Shared (shared_ptr) by the engine, its imported regions and
// its ranks, which may outlive it. A runtime that checks lock order (the
// test fake) is told of each lock (GpuRuntime::OnOrderLock).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/engines/gpu/lock_order.h"
#include "server/engines/gpu/runtime.h"

namespace dmagather::server::engines::gpu {

class DeviceOrder {
 public:
  // Devices 63 and beyond share the last lock (bit 63 of a set).
  using DeviceSet = uint64_t;
  static DeviceSet Of(int device) { return device < 0 ? 0 : DeviceSet{1} << (device < 63 ? device : 63); }
  DeviceOrder(int devices, std::shared_ptr<GpuRuntime> runtime);
  DeviceSet all() const { return all_; }

  // Holds the locks of `devices`, taken in device index order, until it
  // goes out of scope.
  class ABSL_SCOPED_LOCKABLE Hold {
   public:
    // (The analysis cannot tie `order_` to `order`: these annotations say
    // what a Hold holds; the bodies are not analysed.)
    Hold(DeviceOrder& order, DeviceSet devices)
        ABSL_EXCLUSIVE_LOCK_FUNCTION(order.held_) ABSL_NO_THREAD_SAFETY_ANALYSIS;
    ~Hold() ABSL_UNLOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS;
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    DeviceOrder& order_;
    const DeviceSet devices_;
  };

 private:
  // The set's locks are dynamic, which the static analysis cannot follow:
  // it sees them as `held_`.
  void Lock(DeviceSet devices) ABSL_EXCLUSIVE_LOCK_FUNCTION(held_) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void Unlock(DeviceSet devices) ABSL_UNLOCK_FUNCTION(held_) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // What the analysis sees of the device-order locks (never locked itself).
  lock_order::Level held_ ABSL_ACQUIRED_AFTER(lock_order::kDeviceOrder) ABSL_ACQUIRED_BEFORE(lock_order::kHandoff);

  const std::shared_ptr<GpuRuntime> runtime_;
  const DeviceSet all_;
  std::unique_ptr<absl::Mutex[]> mu_;  // Per lock (device, up to 63).
};

}  // namespace dmagather::server::engines::gpu

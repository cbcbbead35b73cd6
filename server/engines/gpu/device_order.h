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
// Threads: any. Shared (shared_ptr) by the engine, its imported regions and
// its ranks, which may outlive it. A runtime that checks lock order (the
// test fake) is told of each lock (GpuRuntime::OnOrderLock).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/synchronization/mutex.h"
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
  class Hold {
   public:
    Hold(DeviceOrder& order, DeviceSet devices);
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    DeviceOrder& order_;
    const DeviceSet devices_;
  };

 private:
  // The set's locks are dynamic, which the static analysis cannot follow.
  void Lock(DeviceSet devices) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void Unlock(DeviceSet devices) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  const std::shared_ptr<GpuRuntime> runtime_;
  const DeviceSet all_;
  std::unique_ptr<absl::Mutex[]> mu_;  // Per lock (device, up to 63).
};

}  // namespace dmagather::server::engines::gpu

// RankImports: what the GPU engine knows of the ranks' devices and memory,
// apart from the per-op path. It owns the devices' identities (UUID, PCI
// bus id: Identify, logged at start), maps a rank's DeviceRef to the
// daemon's device (DaemonDevice: a rank names its GPU by identity as well
// as by its own ordinal, which depends on what its process sees), attaches
// ranks (AttachRank: the rank's completion block registered with the
// runtime, a GpuRank, gpu_rank.h) and imports their memory (Import: the
// runtime's IPC handles opened once and cached by handle, any other kind
// the runtime's own way). Every registration, open and close is made under
// every device's order lock (device_order.h): the mapping lives in (and is
// unmade from) every peer's context. Imported regions and ranks share the
// runtime and the order, so they may outlive the engine.
//
// Threads: Identify on the engine's start-up thread; AttachRank and Import
// on gRPC threads; DaemonDevice and the identities from any thread after
// start-up. Locks: the import cache's mutex (kImports), then the
// device-order locks (kDeviceOrder), in that order (lock_order.h).
#pragma once

#include <map>
#include <memory>
#include <mutex>  // std::once_flag
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/engines/copy_engine.h"
#include "server/engines/gpu/device_order.h"
#include "server/engines/gpu/lock_order.h"
#include "server/engines/gpu/runtime.h"

namespace dmagather::server::engines::gpu {

class RankImports {
 public:
  RankImports(std::shared_ptr<GpuRuntime> runtime, std::shared_ptr<DeviceOrder> order);
  RankImports(const RankImports&) = delete;
  RankImports& operator=(const RankImports&) = delete;

  // Reads (and logs) every device's identity; a device without one cannot
  // be named by identity.
  void Identify();
  const DeviceIdentity& identity(int device) const { return identities_[device]; }

  // The daemon's device for a rank's DeviceRef: by uuid, else bus id, else
  // the rank's ordinal when it sent no identity (or the daemon knows none).
  absl::StatusOr<int> DaemonDevice(const DeviceRef& ref) const;
  absl::StatusOr<std::unique_ptr<EngineRank>> AttachRank(const RankAttach& attach);
  absl::StatusOr<std::shared_ptr<ImportedRegion>> Import(const RegionSpec& spec) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The runtime's IPC handles, opened once per handle.
  absl::StatusOr<std::shared_ptr<ImportedRegion>> ImportIpc(const RegionSpec& spec, int device)
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::shared_ptr<GpuRuntime> runtime_;
  const std::shared_ptr<DeviceOrder> order_;
  const int num_devices_;
  std::vector<DeviceIdentity> identities_;  // Set by Identify, then read-only.
  mutable std::once_flag ordinal_trusted_logged_;
  // The import cache: opened IPC handles, by handle bytes.
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(lock_order::kImports) ABSL_ACQUIRED_BEFORE(lock_order::kDeviceOrder);
  std::map<std::string, std::weak_ptr<ImportedRegion>> imports_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dmagather::server::engines::gpu

// Router: the GPU engine's routing step. For every copy of an op it fills
// the source's and destination's devices (the ranks' devices) and marks the
// device that issues it (PeerTable::IssuingDevice: the destination's when it
// reaches the source, else the source's), so that each device issues its
// own share; an op with a copy between two GPUs that reach each other
// neither way is a FALLBACK with the reason, before anything of it is
// issued. It reads the engine's peer table and counts same-device copies
// (logged once: the driver runs them on SMs) and pushes.
//
// Threads: Route on the routing thread (the ingress or gate thread, under
// the issue lock: involved() is its scratch); the counters from any thread.
// No lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>  // std::once_flag
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/engines/copy_engine.h"
#include "server/engines/gpu/peer_table.h"

namespace dmagather::server::engines::gpu {

class Router {
 public:
  // `peers` outlives the router. `label`: the runtime's name in messages ("CUDA").
  Router(const PeerTable& peers, std::string label);

  // Routes `op` (above); involved() then says which devices issue a share.
  absl::Status Route(EngineOp* op);
  const std::vector<char>& involved() const { return involved_; }
  // Devices marked in involved().
  int shares() const;

  uint64_t same_device_copies() const { return same_device_.load(std::memory_order_relaxed); }
  uint64_t pushes() const { return pushes_.load(std::memory_order_relaxed); }

 private:
  void Count(uint64_t same, uint64_t pushes);

  const PeerTable& peers_;
  const std::string label_;
  std::vector<char> involved_;  // Per device: issues a share of the op routed last.
  std::atomic<uint64_t> same_device_{0}, pushes_{0};
  std::once_flag same_device_logged_;
};

}  // namespace dmagather::server::engines::gpu

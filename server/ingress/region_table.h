// RegionTable: the buffers one rank has registered, by region id, and the
// bounds-checked translation of (region id, offset, bytes) into a
// daemon-side address that validation does for every descriptor.
//
// Threads: Add/Remove on gRPC threads (Register/Deregister), Resolve on the
// ingress thread; a mutex that is uncontended on the per-op path.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/engines/copy_engine.h"

namespace dmagather::server::ingress {

class RegionTable {
 public:
  explicit RegionTable(int rank) : rank_(rank) {}

  void Add(uint32_t region_id, std::shared_ptr<engines::ImportedRegion> region);
  // Refuses while ops of the rank are in flight (`inflight` != 0): a region
  // never goes away under an op, because ingress counts an op in before
  // resolving its buffers.
  absl::Status Remove(uint32_t region_id, const std::atomic<uint32_t>& inflight);
  // Daemon-side address of [offset, offset+bytes) of a region, checked.
  absl::StatusOr<char*> Resolve(uint32_t region_id, uint64_t offset, uint64_t bytes, const char* what) const;
  // A reference that keeps a region mapped (a persistent op's buffers);
  // null when there is no such region.
  std::shared_ptr<engines::ImportedRegion> Hold(uint32_t region_id) const;
  // Drops every region (the rank is gone and nothing is in flight).
  void Clear();

  uint64_t registered_bytes() const;
  int size() const;

 private:
  const int rank_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, std::shared_ptr<engines::ImportedRegion>> regions_ ABSL_GUARDED_BY(mu_);
  uint64_t registered_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dmagather::server::ingress

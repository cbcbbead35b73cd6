// VmmImporter: the daemon's side of "cuda_vmm" memory - GPU allocations made
// with cuMemCreate (PyTorch's expandable segments, NCCL's cuMem buffers)
// that legacy CUDA IPC cannot open. The client exported every physical
// allocation ("chunk") behind a registered range as a POSIX file descriptor
// and handed them over on the fd channel; the chunk table
// (abi/device_memory_v1.h) says where each one sits in the range. Import
// imports each descriptor (cuMemImportFromShareableHandle), reserves one
// address range for the whole region (cuMemAddressReserve), maps every chunk
// at its offset (cuMemMap), and makes the range readable and writable from
// its own device and, one grant each (cuMemSetAccess), from every device
// the peer table says reaches it - exactly the devices the engine may issue
// a copy of it on: a range over several chunks is one contiguous region to
// the copy engines, as it is to the client. A grant the driver refuses
// fails the import (FALLBACK naming the pair): a region some device could
// not read would fault a copy, and a fault is sticky for the whole daemon.
//
// Imports are cached by (process, device, chunk table): the table carries the
// client's identity of every mapping (its generation), so a range the
// client's allocator unmapped and mapped again is a new import, never a stale
// hit. The mapping is unmapped and its range freed with the last reference
// (weak cache entries, as for IPC handles).
//
// Only driver entry points are used, through a DriverApi table: the CPU unit
// test (tests/server/engines/gpu/vmm_import_test) drives it with a fake one.
//
// Threads: Import on gRPC threads (Register), serialised by its own mutex
// (mu_: the peer table and the cache); regions are released on whatever
// thread drops the last reference.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "abi/device_memory_v1.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda/cuda_api.h"
#include "server/engines/copy_engine.h"
#include "server/engines/gpu/peer_table.h"

namespace dmagather::server::engines::gpu::cuda {

struct VmmTable {
  int device = -1;
  std::vector<abi::VmmChunkV1> chunks;
};

// The chunk table of a registration: stamped, one chunk per handed-over
// descriptor, chunks back to back from offset 0 adding up to `bytes`.
absl::StatusOr<VmmTable> ParseVmmTable(const std::string& handle, uint64_t bytes, size_t num_fds);

// The bytes of a chunk table (the client writes it; tests build one).
std::string EncodeVmmTable(int device, const std::vector<abi::VmmChunkV1>& chunks);

class VmmImporter {
 public:
  // Told a region's range [base, base + bytes) before it is unmapped, so
  // what was built on those addresses (copy graphs) goes before they can be
  // reused.
  using ReleaseFn = std::function<void(uint64_t base, uint64_t bytes)>;
  // `on_release`: optional.
  explicit VmmImporter(const ::dmagather::common::cuda::DriverApi* api, ReleaseFn on_release = nullptr);

  // Which devices reach which (the engine's table; until set, a region is
  // granted to its own device only).
  void SetPeers(const PeerTable& peers) ABSL_LOCKS_EXCLUDED(mu_);

  // `device`: the owning rank's device as the daemon numbers it (the
  // mapping's home); `rank_ordinal`: the same device as the rank numbers it
  // (what its chunk table says; checked).
  absl::StatusOr<std::shared_ptr<ImportedRegion>> Import(const RegionSpec& spec, int device, int rank_ordinal)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Live imports in the cache (for tests and stats).
  size_t live_imports() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::StatusOr<std::shared_ptr<ImportedRegion>> MapRegion(const VmmTable& table, int device,
                                                            const std::vector<int>& fds, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ::dmagather::common::cuda::DriverApi* const api_;
  const ReleaseFn on_release_;
  absl::Mutex mu_;
  PeerTable peers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::weak_ptr<ImportedRegion>> cache_ ABSL_GUARDED_BY(mu_);  // (pid, device, table) -> region.
};

}  // namespace dmagather::server::engines::gpu::cuda

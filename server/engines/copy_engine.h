// CopyEngine: the stage that moves bytes. The scheduler hands it a plan of
// (src, dst, bytes) copies in the daemon's address space (host pointers for
// the host backend, IPC-mapped device pointers for cuda) and is called back
// once all of them have landed. Backends: host/ (worker threads), cuda/.
//
// Threads: Import() runs on gRPC threads (Register); Execute() on the
// ingress thread; OnEngineDone() is called on an engine thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dmagather::server::engines {

enum class MemoryKind { kHostShm = 1, kCudaIpc = 2 };

// What a client asks the daemon to import.
struct RegionSpec {
  MemoryKind kind = MemoryKind::kHostShm;
  uint64_t bytes = 0;
  std::string shm_name;    // kHostShm
  std::string ipc_handle;  // kCudaIpc
  int device = -1;         // Device of the owning rank (cuda).
};

// A rank's memory as the daemon sees it. Unmapped when the last reference goes.
class ImportedRegion {
 public:
  virtual ~ImportedRegion() = default;
  virtual char* base() const = 0;
  virtual uint64_t bytes() const = 0;
  // Owner of the memory (host: the shm object's uid). -1 when unknown.
  virtual int64_t owner_uid() const { return -1; }
  virtual int device() const { return -1; }
};

struct CopyCmd {
  char* dst;
  const char* src;
  uint64_t bytes;
  int32_t src_rank;
  int32_t dst_rank;
};

struct CopyPlan {
  std::vector<CopyCmd> copies;
  uint64_t bytes = 0;  // Sum of copies[].bytes.
  void Clear() {
    copies.clear();
    bytes = 0;
  }
};

// One op as the engine sees it. Owned by the scheduler; reused across ops
// (the vectors keep their capacity, so steady state allocates nothing).
class EngineOp {
 public:
  virtual ~EngineOp() = default;
  // Called exactly once per Execute(), from an engine thread.
  virtual void OnEngineDone(absl::Status status) = 0;

  CopyPlan plan;
  // Engine scratch space: the plan cut into chunks and the claim counters.
  std::vector<CopyCmd> chunks;
  std::atomic<size_t> next_chunk{0};
  std::atomic<size_t> chunks_left{0};

  // For engines that order copies on the GPU (cuda), filled by the
  // scheduler before Execute(): the op's sequence number and, per rank, the
  // device address of its ready flag (0: none) and its CUDA device (-1).
  // Copies start once every rank's ready flag has reached flag_seq.
  uint32_t flag_seq = 0;
  std::vector<uint64_t> ready_flags;
  std::vector<int> devices;
};

struct EngineStats {
  uint64_t ops = 0;
  uint64_t bytes = 0;
  uint64_t chunks = 0;
  uint64_t same_device_copies = 0;
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual const char* name() const = 0;
  virtual absl::StatusOr<std::shared_ptr<ImportedRegion>> Import(const RegionSpec& spec) = 0;
  // Starts the op's copies and returns; never blocks on them.
  virtual void Execute(EngineOp* op) = 0;
  // Finishes what was queued, then stops the engine's threads.
  virtual void Stop() = 0;
  virtual EngineStats stats() const = 0;
  virtual int worker_threads() const = 0;

  // A rank's completion block (page-aligned `bytes` at `pages`, mapped in
  // the daemon) is about to be used: returns the address at which the
  // engine's streams see the 32-bit word `ready_word` inside it (cuda:
  // cudaHostRegister + device pointer), or 0 when the engine does not use
  // GPU flags (host). DetachFlags undoes it before the block is unmapped.
  // Called on gRPC threads (Join) and the ingress thread (reaping).
  virtual absl::StatusOr<uint64_t> AttachFlags(void* pages, uint64_t bytes, const uint32_t* ready_word) {
    (void)pages;
    (void)bytes;
    (void)ready_word;
    return uint64_t{0};
  }
  virtual void DetachFlags(void* pages) { (void)pages; }
};

}  // namespace dmagather::server::engines

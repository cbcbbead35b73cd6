// CopyEngine: the stage that moves bytes. The scheduler hands it a plan of
// (src, dst, bytes) copies in the daemon's address space (host pointers for
// the host backend, IPC-mapped device pointers for cuda and hip) and is
// called back once all of them have landed. Backends (host/; gpu/, the one
// GpuEngine registered as cuda and as hip) register themselves by name in
// engine_registry.h; nothing above this layer names a backend.
//
// Per-rank state that only an engine understands (a GPU rank's device and
// the engine-visible address of its ready flag) lives in the EngineRank the
// engine returns from AttachRank; the scheduler passes those back with each
// op without looking inside.
//
// Threads: AttachRank()/Import() run on gRPC threads (Join/Register);
// Execute() on the ingress thread; OnEngineDone() on an engine thread (or,
// for empty plans, inside Execute()).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/memory_kinds.h"

namespace dmagather::server::engines {

// Where a rank runs: "cpu", or an accelerator kind ("cuda", "hip") and its
// ordinal as the rank's process numbers it - which is not the daemon's
// numbering when the rank sees a different set of devices (one visible GPU
// per rank is the usual launch). The identity names the device itself: the
// GPU engine maps it to its own device (AttachRank) and refuses what it
// cannot map.
struct DeviceRef {
  std::string kind = "cpu";
  int ordinal = -1;
  std::string uuid;        // 16 raw bytes ("" from clients that do not send it).
  std::string pci_bus_id;  // "0000:19:00.0" ("" if unknown).
};

using common::kMemoryCudaIpc;
using common::kMemoryCudaVmm;
using common::kMemoryHostMemfd;

// The engine's own state for one rank (device, flag mappings). Created at
// Join by AttachRank, destroyed (undoing what AttachRank did) before the
// rank's segment is unmapped.
class EngineRank {
 public:
  virtual ~EngineRank() = default;
};

// What AttachRank gets: the rank's device and its completion block (the
// page-aligned `flag_bytes` at `flag_pages`, mapped in the daemon), in which
// `ready_word` is the rank's ready flag.
struct RankAttach {
  int rank = -1;
  DeviceRef device;
  void* flag_pages = nullptr;
  uint64_t flag_bytes = 0;
  const uint32_t* ready_word = nullptr;
  const uint32_t* done_word = nullptr;  // In the same pages as ready_word.
};

// What a client asks the daemon to import.
struct RegionSpec {
  std::string kind;  // kMemoryHostMemfd, kMemoryCudaIpc, ...
  uint64_t bytes = 0;
  int fd = -1;           // kMemoryHostMemfd: the sealed memfd the client handed over (borrowed for the call).
  std::vector<int> fds;  // kMemoryCudaVmm: the exported allocations, in chunk order (borrowed for the call).
  pid_t owner_pid = 0;   // The registering process (kernel identity), for import caches.
  std::string handle;    // Opaque export handle (kMemoryCudaIpc: 64 bytes).
  const EngineRank* rank = nullptr;  // The owning rank (its device).
};

// A rank's memory as the daemon sees it. Unmapped when the last reference goes.
class ImportedRegion {
 public:
  virtual ~ImportedRegion() = default;
  virtual char* base() const = 0;
  virtual uint64_t bytes() const = 0;
};

struct CopyCmd {
  char* dst;
  const char* src;
  uint64_t bytes;
  int32_t src_rank;
  int32_t dst_rank;
  // The engine's devices of the source and destination memory (GPU
  // engines fill them when they route the op; -1 elsewhere).
  int32_t src_device = -1;
  int32_t dst_device = -1;
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
  // Called exactly once per Execute().
  virtual void OnEngineDone(absl::Status status) = 0;

  CopyPlan plan;
  // The op's sequence number (what the ranks' ready flags count to) and,
  // per rank, the EngineRank from AttachRank. Set before Execute().
  uint32_t seq = 0;
  std::vector<const EngineRank*> ranks;
  // The op's job (non-zero, unique in the daemon's life). Ops of one job
  // are ordered among themselves; an engine never makes one job's op wait
  // behind another job's (their ranks may order the jobs' ops either way).
  uint64_t job_id = 0;
  // The engine writes every rank's done flag (seq) on the device once the
  // op's copies are done, where it can (writes_done()); the scheduler still
  // ends the op (OnEngineDone) and never lets the flag go backwards. Set
  // by the scheduler only where that cannot show a failed op as done
  // (Job::Dispatch, "done on the device").
  bool gpu_done = false;
  // The ranks' inputs are known to be ready already (a persistent op's
  // replay: the daemon saw every rank's graph ready flag), so the engine
  // does not wait on the ready_seq flags.
  bool ready_observed = false;
  // Engine scratch space: the plan cut into chunks and the claim counters.
  std::vector<CopyCmd> chunks;
  std::atomic<size_t> next_chunk{0};
  std::atomic<size_t> chunks_left{0};
};

// Bytes moved on one DMA engine of a device, where the engine chooses its
// copy engines itself (hip with hsa-runtime's engine choice); engine -1:
// copies left to the runtime's own choice.
struct CopyEngineBytes {
  int device = 0;
  int engine = -1;
  uint64_t bytes = 0;
};

struct EngineStats {
  uint64_t ops = 0;
  uint64_t bytes = 0;
  uint64_t chunks = 0;
  uint64_t same_device_copies = 0;
  // Times an engine thread asleep was woken to take work (a per-device
  // issuer or completion thread, the gate): what an op costs in wake-ups
  // beside the ingress thread's.
  uint64_t thread_wakeups = 0;
  // Ops a GPU engine held on the CPU until an earlier op of their job ended
  // (the bound on ops ahead of their ready flags): each went GPU -> CPU ->
  // GPU, the round trip the device waits otherwise avoid.
  uint64_t held_on_cpu = 0;
  std::vector<CopyEngineBytes> copy_engines;  // GPU engines; engine -1 per GPU where the runtime picks.
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual const char* name() const = 0;
  // The engine's context for a joining rank (cuda: checks the device,
  // registers the completion block so streams can read the ready flag).
  virtual absl::StatusOr<std::unique_ptr<EngineRank>> AttachRank(const RankAttach& attach) {
    (void)attach;
    return std::make_unique<EngineRank>();
  }
  virtual absl::StatusOr<std::shared_ptr<ImportedRegion>> Import(const RegionSpec& spec) = 0;
  // Starts the op's copies and returns; never blocks on them.
  virtual void Execute(EngineOp* op) = 0;
  // Finishes what was queued, then stops the engine's threads.
  virtual void Stop() = 0;
  virtual EngineStats stats() const = 0;
  virtual int worker_threads() const = 0;

  // --- Multi-node jobs: the ring's transit (server/cluster/ring.h) ---
  // True when rank memory is plain memory of the daemon (host backend): the
  // ring lands received bytes in the outputs directly.
  virtual bool host_addressable() const { return false; }
  // True when the engine can write the ranks' done flags from the device
  // after an op's copies (EngineOp::gpu_done), with no CPU in between.
  virtual bool writes_done() const { return false; }
  // Otherwise the ring stages through pinned host memory of the daemon and
  // these synchronous copies between it and a rank's memory, on the DMA
  // copy engines (host<->device, never a kernel). Called from ring threads.
  virtual absl::StatusOr<void*> AllocStaging(uint64_t bytes);
  virtual void FreeStaging(void* host);
  // rank memory -> host
  virtual absl::Status StageOut(void* host, const char* src, uint64_t bytes, const EngineRank* rank);
  // host -> rank memory
  virtual absl::Status StageIn(char* dst, const void* host, uint64_t bytes, const EngineRank* rank);
  // Blocks until `rank` has reached op `seq` in its own order (its ready
  // flag), so staging reads inputs that are written and writes outputs no
  // earlier work still reads - what the engine's own copies wait for on the
  // device. Ends early (CANCELLED) once `cancel` is set. Host backend: a
  // rank's submit is its ready point, so OK at once.
  virtual absl::Status WaitRankReady(const EngineRank* rank, uint32_t seq, const std::atomic<bool>& cancel) {
    (void)rank;
    (void)seq;
    (void)cancel;
    return absl::OkStatus();
  }
};

}  // namespace dmagather::server::engines

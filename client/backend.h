// ClientBackend: the part of a rank that depends on the daemon's backend -
// what memory the daemon can import and how it is exported, and how a
// submit is ordered against the caller's work (CPU stores, or stream memory
// operations on a GPU stream). CommImpl holds one, chosen once at Join from
// the backend the daemon reports; nothing else in the client names a
// backend. Implementations register themselves by name
// (RegisterClientBackend, in their own .cc, linked with alwayslink), so a
// build without CUDA simply has no "cuda" entry.
//
// Threads: the rank's submitting thread (CommImpl's caller).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "abi/completion_v1.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/vmm_walk.h"
#include "common/memfd.h"

namespace dmagather::client {

// How the daemon can import a buffer (the RegisterRequest's fields).
struct MemoryExport {
  uintptr_t base = 0;       // Allocation base in this process.
  uint64_t bytes = 0;       // Allocation size.
  uint64_t buffer_id = 0;   // Changes when the address range is freed and reused (0: not tracked).
  std::string memory_kind;  // "host_memfd", "cuda_ipc", ...
  int fd = -1;              // "host_memfd": the sealed memfd, handed over on the fd channel (owned by the buffer).
  std::string handle;
  // "cuda_vmm": the chunks behind the range (identities for the submit-time
  // check) and their exported descriptors, handed over on the fd channel.
  std::vector<VmmChunk> chunks;
  std::shared_ptr<std::vector<common::UniqueFd>> device_fds;
};

// Memory the library allocated for the caller (dmagather_alloc).
class OwnedBuffer {
 public:
  virtual ~OwnedBuffer() = default;  // Frees the memory.
  virtual void* data() const = 0;
  virtual const MemoryExport& export_info() const = 0;
  // The daemon has imported it.
  virtual void Registered() {}
};

// One copy of a rank's own shard into its slot of the output (same device).
struct OwnShardCopy {
  void* dst;
  const void* src;
  uint64_t bytes;
};

// Graph slots whose CUDA graphs were destroyed: the backend's destruction
// callback adds them (any thread), the communicator takes them back.
// An op captured into a CUDA graph, as the rank defined it (GraphSlots):
// what a daemon that takes the job back arms again.
struct CapturedDefinition {
  uint32_t seq = 0;
  uint32_t slot = 0;
  std::string descriptors;  // abi::DescriptorV2 each, as published.
};

// One reduction of a reduce-scatter (common/reduce.h has the numerics):
// chunk s of `count` elements at chunks[s], summed in chunk order into
// `out`, which may be one of the chunks exactly (in place), never a part.
struct ReduceArgs {
  const void* chunks[64] = {};
  int n = 0;
  uint64_t count = 0;
  uint32_t dtype = 0;
  int redop = 0;
  void* out = nullptr;
};

// A point in a stream (cuda: an event): what a later user of a staging
// buffer waits for, on its own stream or on the host.
class StreamMark {
 public:
  virtual ~StreamMark() = default;
  virtual absl::Status Record(void* stream) = 0;
  virtual absl::Status WaitOn(void* stream) = 0;  // `stream` waits for the mark (no host sync).
  virtual absl::Status Sync() = 0;                // The host waits for it.
  virtual absl::StatusOr<bool> Reached() = 0;
};

struct GraphSlotsFreed {
  absl::Mutex mu;
  std::vector<uint32_t> freed ABSL_GUARDED_BY(mu);
  // The rank's ready words (abi::GraphFlagsV1::ready): a freed slot's gets
  // kGraphSlotReleasedV1 so the daemon retires its op. Null once the
  // communicator is gone.
  uint32_t* ready ABSL_GUARDED_BY(mu) = nullptr;
};

class ClientBackend {
 public:
  virtual ~ClientBackend() = default;
  virtual const char* name() const = 0;

  // --- Memory ---
  virtual absl::StatusOr<std::unique_ptr<OwnedBuffer>> Allocate(uint64_t bytes) = 0;
  // How the allocation containing [ptr, ptr+bytes) can be exported:
  // FALLBACK when the backend cannot reach such memory at all,
  // INVALID_ARGUMENT when the buffer is wrong (wrong device, past the end).
  virtual absl::StatusOr<MemoryExport> Describe(const void* ptr, uint64_t bytes) const = 0;
  // Makes a thread of the library's own (the reconnect thread, which
  // registers the rank's memory again with a new daemon) able to Describe:
  // the rank's device current on it (driver calls need its context).
  virtual absl::Status PrepareThread() const { return absl::OkStatus(); }
  // Current buffer id of the allocation containing ptr (0: not tracked).
  virtual uint64_t BufferId(const void* ptr) const = 0;
  // A registration with chunks (VMM): whether the chunks under [ptr,
  // ptr+bytes) are still the mappings that were registered.
  virtual bool ChunksCurrent(uintptr_t base, const std::vector<VmmChunk>& chunks, const void* ptr,
                             uint64_t bytes) const {
    (void)base, (void)chunks, (void)ptr, (void)bytes;
    return true;
  }
  // Whether an unregistered buffer passed to a submit is registered on the
  // way (cuda: any device pointer) or is a caller error (host: only
  // dmagather_alloc memory is reachable).
  virtual bool registers_on_submit() const = 0;

  // --- Ordering of a submit ---
  virtual absl::Status CheckStream(void* stream) const = 0;
  // True when the daemon never copies a rank's own shard (it would be a
  // same-device copy, which the daemon's context runs on SMs/CUs): the
  // client copies it in the caller's stream.
  virtual bool copies_own_shard() const = 0;
  // Enqueues one op's own-shard copies on `stream`, in stream order, on a
  // DMA engine where the runtime does that from a process with compute work
  // (cuda: one cudaMemcpyBatchAsync with PreferOverlapWithCompute; hip:
  // hipMemcpyDeviceToDeviceNoCU from ROCm 6.1), else as plain copies.
  // `capturing`: `stream` is being captured into a graph.
  virtual absl::Status CopyOwnShards(const OwnShardCopy* copies, size_t n, void* stream, bool capturing) = 0;
  // Inputs of op `seq` are ready at this point (of `stream`).
  virtual absl::Status WriteReady(void* stream, uint32_t seq) = 0;
  // Makes `stream` wait until op `seq` is done. False from
  // has_stream_waits(): nothing to enqueue (the host waits instead).
  virtual bool has_stream_waits() const = 0;
  virtual absl::Status WaitDoneOnStream(void* stream, uint32_t seq) = 0;

  // --- Reduce-scatter: the rank's own sum of the chunks the daemon moved ---
  // Why this backend cannot reduce (FALLBACK), else OK.
  virtual absl::Status CanReduce() const;
  // Runs `a` (host: now, on the calling thread) or enqueues it on `stream`
  // (GPU: a small kernel, the reduction's only use of SMs/CUs).
  virtual absl::Status Reduce(const ReduceArgs& a, void* stream) {
    (void)a, (void)stream;
    return CanReduce();
  }
  // A new mark; null where the host runs the reductions itself.
  virtual absl::StatusOr<std::unique_ptr<StreamMark>> NewMark() { return std::unique_ptr<StreamMark>(); }

  // --- CUDA-graph capture (abi/graph_v1.h) ---
  // Whether `stream` is being captured into a graph; an error where a
  // capture cannot hold a submit (an invalidated capture). Host: never.
  virtual absl::StatusOr<bool> Capturing(void* stream) const {
    (void)stream;
    return false;
  }
  // The replayed stream operations of the persistent op in graph slot
  // `slot`: inputs ready (a constant write), and wait for done + re-arm.
  virtual absl::Status WriteGraphReady(void* stream, uint32_t slot) {
    (void)stream, (void)slot;
    return absl::UnimplementedError("this backend has no graph capture");
  }
  virtual absl::Status WaitGraphDone(void* stream, uint32_t slot) {
    (void)stream, (void)slot;
    return absl::UnimplementedError("this backend has no graph capture");
  }
  // Ties graph slot `slot` to the graph `stream` captures into: when that
  // graph (and every instance of it) is destroyed, the slot goes to `freed`.
  virtual absl::Status OnGraphSlotTaken(void* stream, uint32_t slot, std::shared_ptr<GraphSlotsFreed> freed) {
    (void)stream, (void)slot, (void)freed;
    return absl::OkStatus();
  }
};

// What a backend gets at creation: the rank's completion block (page-
// aligned, `flag_bytes`) and its device ordinal from the probe.
struct ClientBackendContext {
  abi::CompletionV1* completion = nullptr;
  uint64_t flag_bytes = 0;
  int device = -1;
};

struct ClientBackendEntry {
  std::string name;
  int priority = 0;
  // The device this process would use with this backend (-1: none), and
  // the device kind it reports at Join ("cuda", ...).
  std::function<int()> probe_device;
  std::string device_kind;
  std::function<absl::StatusOr<std::unique_ptr<ClientBackend>>(const ClientBackendContext&)> create;
  // What names the device whatever this process's visible devices: its
  // 16-byte uuid and PCI bus id ("" each if unknown). The daemon maps the
  // rank's device by them. Optional.
  std::function<void(int device, std::string* uuid, std::string* pci_bus_id)> identify;
};

// Static registration (one per backend .cc).
bool RegisterClientBackend(ClientBackendEntry entry);

// The device this process reports at Join: the highest-priority backend
// with a device, else {"cpu", -1}.
struct ProbedDevice {
  std::string kind = "cpu";
  int ordinal = -1;
  std::string uuid;        // 16 raw bytes, or "".
  std::string pci_bus_id;  // "0000:19:00.0", or "".
};
ProbedDevice ProbeDevice();

// The backend named by the daemon's Join reply. FALLBACK (with the reason)
// when this library has no such backend or it cannot run here.
absl::StatusOr<std::unique_ptr<ClientBackend>> CreateClientBackend(const std::string& name,
                                                                   const ClientBackendContext& ctx);

}  // namespace dmagather::client

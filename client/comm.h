// CommImpl: one rank's connection to dmagatherd. Join and registration go
// over gRPC; every AllGather is one descriptor per item in the rank's
// shared-memory ring (no system call, no allocation), completed through
// the done flag. What depends on the daemon's backend (memory export,
// stream ordering) is behind ClientBackend, chosen once at Join. A watcher
// thread holds the Join stream: when it ends, the daemon is gone.
//
// Every submit takes a sequence number, also when this rank cannot take
// part (it then publishes a refusal), so all ranks of a job see the same
// ops and get the same verdict for each.
//
// Threads: one user thread at a time calls the public methods; the watcher
// thread only sets daemon_gone_ (and, on GPU backends, releases done_seq).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "abi/descriptor_v2.h"
#include "abi/ring_v1.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/backend.h"
#include "common/memfd.h"
#include "dmagather/dmagather.h"
#include "dmagather/v1/control.grpc.pb.h"

namespace dmagather::client {

struct CommOptions {
  std::string socket_path;  // Empty: $DMAGATHER_SOCKET, then the default.
  std::string job_key;
  int world_size = 0;
  int rank = 0;
  int join_timeout_ms = 60000;
  int spin = -1;  // < 0: $DMAGATHER_SPIN, then the daemon's advice, then 256.
  int local_rank = -1;
  int local_world_size = -1;
  std::string job_id;  // Multi-node job: from CreateJobId on one rank ("" = one node).
};

// A new multi-node job id from the daemon at `socket_path` ("" = default).
absl::StatusOr<std::string> CreateJobId(const std::string& socket_path);

// One tensor of an op as the caller passed it.
struct GatherItem {
  bool list = false;
  const void* send = nullptr;
  void* const* recvs = nullptr;  // 1 (flat) or world_size (list) pointers.
  size_t count = 0;
  dmagather_dtype_t dtype = DMAGATHER_UINT8;
};

class CommImpl {
 public:
  static absl::StatusOr<std::unique_ptr<CommImpl>> Create(const CommOptions& options);
  ~CommImpl();

  absl::StatusOr<void*> Alloc(size_t bytes);
  absl::Status Free(void* ptr);
  absl::Status Register(void* ptr, size_t bytes);
  absl::Status Deregister(void* ptr);

  // Submits one op (1..DMAGATHER_MAX_COALESCED items); *op gets its handle
  // whenever a sequence number was taken, also when this rank refused.
  absl::Status Submit(const GatherItem* items, size_t n, void* stream, uint64_t* op);
  // This rank will not take part in its next op: FALLBACK everywhere.
  absl::Status SubmitFallback(const std::string& reason, uint64_t* op);
  // The classic calls: submit, and on stream backends make `stream` wait.
  absl::Status AllGather(const void* send, void* recv, size_t count, dmagather_dtype_t dtype, void* stream);
  absl::Status AllGatherList(const void* send, void* const* recvs, size_t count, dmagather_dtype_t dtype,
                             void* stream);

  absl::Status OpWait(uint64_t op);
  absl::StatusOr<bool> OpTest(uint64_t op, absl::Status* op_status);
  absl::Status OpWaitStream(uint64_t op, void* stream);
  // Waits for every outstanding op; the first error since the last Wait.
  absl::Status Wait();
  // Leaves the job (after waiting for outstanding ops).
  absl::Status Close();

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const std::string& backend() const { return backend_name_; }
  const std::string& daemon_version() const { return daemon_version_; }
  uint32_t submitted() const { return static_cast<uint32_t>(submitted_); }

  // Publishes a hand-made v1 descriptor through the normal ring path (its
  // seq is set to the next one). For tests of the daemon's validation.
  absl::Status SubmitRawForTesting(const abi::DescriptorV1& d);

 private:
  struct Region {
    uint64_t bytes = 0;
    uint32_t id = 0;
    uint64_t buffer_id = 0;              // Allocation identity (0: not tracked by the backend).
    std::vector<VmmChunk> chunks;        // VMM: the mappings registered (checked instead of buffer_id).
    std::unique_ptr<OwnedBuffer> owned;  // Set when dmagather_alloc made it.
  };
  // The status of one finished op, from its error record.
  struct OpRecord {
    uint32_t seq = 0;
    int32_t status = 0;
    std::string message;
    bool reported = false;  // op_wait/op_test returned it (dmagather_wait skips it).
  };

  explicit CommImpl(const CommOptions& options);
  absl::Status Join();
  // Region + offset of [ptr, ptr+bytes) in the registration map.
  absl::StatusOr<abi::BufferRefV1> Lookup(const void* ptr, uint64_t bytes, const char* what) const;
  // Lookup(), registering unknown or reused memory on the way where the
  // backend allows it.
  absl::StatusOr<abi::BufferRefV1> Resolve(const void* ptr, uint64_t bytes, const char* what);
  // Registers the allocation described by `e` (dropping stale overlapping
  // registrations of freed-and-reused memory first).
  absl::Status RegisterExport(const MemoryExport& e, std::unique_ptr<OwnedBuffer> owned);
  absl::Status DeregisterRegion(uint32_t region_id);
  // Whether the registration at `base` still describes the memory under
  // [ptr, ptr+bytes) (not freed and reused, not unmapped and remapped).
  bool Current(uintptr_t base, const Region& r, const void* ptr, uint64_t bytes) const;
  // Whether an existing registration must go before `e` is registered: it
  // overlaps `e` and is not the very same mappings (VMM regions may overlap).
  bool Stale(uintptr_t base, const Region& r, const MemoryExport& e) const;
  // Fills `d` for one item (buffers resolved, own shard copied on stream
  // backends). Any error means this rank refuses the op.
  absl::Status PrepareItem(const GatherItem& item, void* stream, abi::DescriptorV2* d);
  // The op's descriptors name no region dropped while the op was prepared.
  absl::Status RenameDropped(size_t n);
  // Publishes `n` descriptors of op `seq` (items_following set here).
  absl::Status Publish(abi::DescriptorV2* ds, size_t n);
  absl::Status PublishRefusal(const absl::Status& why);
  // The capture path of Submit: defines a persistent op in graph `slot`
  // (items in scratch_), waits for its verdict, then enqueues the deferred
  // own-shard copies and the graph's ready write on `stream`.
  absl::Status SubmitCaptured(size_t n, void* stream, uint32_t slot, uint64_t* op);
  int TakeGraphSlot();  // -1 when every slot is held.
  void ReleaseGraphSlot(uint32_t slot);
  absl::Status PublishSlot(const void* d, size_t bytes);
  absl::Status CheckHealthy();  // Open, daemon alive, no job-ending error.
  // Blocks until done_seq >= seq (cyclically) or the daemon is gone.
  absl::Status WaitDone(uint32_t seq);
  // Reads new error records into op_records_.
  void ScanErrors();
  absl::Status OpStatus(uint32_t seq);
  absl::Status CollectErrors();  // First error since the last Wait.
  absl::Status DaemonGone() const;
  // Checks that `op` names a submitted op; its 32-bit sequence number.
  absl::StatusOr<uint32_t> OpSeq(uint64_t op) const;
  std::string Rank() const;  // "rank N: "

  const CommOptions options_;
  std::string backend_name_;
  std::string daemon_version_;
  uint64_t session_id_ = 0;
  std::string session_secret_;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Control::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> join_ctx_;
  std::unique_ptr<grpc::ClientReader<v1::JoinEvent>> join_stream_;
  std::thread watcher_;
  std::atomic<bool> daemon_gone_{false};
  mutable absl::Mutex gone_mu_;
  std::string gone_reason_;

  common::MemfdMapping segment_;  // Keeps its memfd (sealed) for the session's life.
  abi::SegmentViewV1 view_;
  common::MemfdMapping doorbell_;
  abi::DoorbellV1* bell_ = nullptr;

  uint32_t spin_ = 256;
  bool spin_set_ = false;  // By the options or $DMAGATHER_SPIN (else the daemon advises).
  uint32_t yields_ = 0;  // sched_yield()s after the spins, before sleeping ($DMAGATHER_YIELDS).
  uint64_t submitted_ = 0;    // Ops submitted (the last op handle); low 32 bits = its sequence number.
  uint32_t errors_seen_ = 0;  // Error records returned by Wait().
  uint32_t errors_scanned_ = 0;
  uint32_t scanned_done_ = 0;  // done_seq at the last ScanErrors.
  // Ops in (lost_from_, lost_upto_] may have lost their error record (more
  // failures than the block holds arrived between two scans).
  uint32_t lost_from_ = 0;
  uint32_t lost_upto_ = 0;
  std::vector<OpRecord> op_records_;  // By seq % ring slots.
  bool closed_ = false;
  std::map<uintptr_t, Region> regions_;  // By client base address.
  std::vector<abi::DescriptorV2> scratch_;  // Descriptors of the op being submitted.
  // Regions RegisterExport dropped (id, client base) since Submit began: a
  // registration for a later item may replace a region an earlier item names
  // (VMM: the same first chunk, a longer range).
  std::vector<std::pair<uint32_t, uintptr_t>> dropped_;

  // CUDA-graph capture: graph slots in use (bit per slot), the captured ops
  // by handle (their slot, and whether a stream wait was captured), the own-
  // shard copies of the op being captured (enqueued after its verdict), and
  // the slots whose graphs were destroyed (filled by a CUDA callback).
  struct GraphOp {
    uint32_t slot = 0;
    bool waited = false;
  };
  struct DeferredCopy {
    void* dst;
    const void* src;
    uint64_t bytes;
  };
  uint32_t graph_slots_used_ = 0;
  std::map<uint64_t, GraphOp> graph_ops_;
  bool defer_copies_ = false;
  std::vector<DeferredCopy> deferred_;
  std::shared_ptr<GraphSlotsFreed> graph_free_ = std::make_shared<GraphSlotsFreed>();

  // Declared last: released (stream registrations undone, owned memory
  // freed) before the segment goes.
  std::unique_ptr<ClientBackend> backend_;
  uint32_t released_done_ = 0;  // done_seq when the daemon went away (stream backends).
};

}  // namespace dmagather::client

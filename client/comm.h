// CommImpl: one rank's connection to dmagatherd. Join and registration go
// over gRPC (ControlChannel); every AllGather is one descriptor per item in
// the rank's shared-memory ring (no system call, no allocation), completed
// through the done flag. What depends on the daemon's backend (memory
// export, stream ordering) is behind ClientBackend, chosen once at Join. A
// watcher thread holds the Join stream: when it ends, the daemon is gone,
// and the rank waits for a daemon to take the job back (DaemonLink).
// Its pieces: DaemonLink (the control channel, taking the job back),
// RegistrationCache (pointer -> region), OpTable (op handles and error
// records), RingWriter (descriptors into the ring), DoneFlag (waiting for
// ops, the daemon going away), GraphSlots (CUDA-graph capture); this class
// is the submit path and the glue.
//
// Every submit takes a sequence number, also when this rank cannot take
// part (it then publishes a refusal), so all ranks of a job see the same
// ops and get the same verdict for each.
//
// Threads: one user thread at a time calls the public methods; the daemon
// link's threads (DaemonLink: the stream's watcher and the reconnect
// thread) take the job back when the daemon goes away, or mark it gone
// (DoneFlag::MarkGone: why, and on GPU backends the release of done_seq).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "abi/descriptor_v2.h"
#include "abi/ring_v1.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/backend.h"
#include "client/control_channel.h"
#include "client/daemon_link.h"
#include "client/done_flag.h"
#include "client/graph_slots.h"
#include "client/op_table.h"
#include "client/registration_cache.h"
#include "client/ring_writer.h"
#include "common/memfd.h"
#include "dmagather/dmagather.h"

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
  // How long the rank waits for a daemon to take its job back after its
  // daemon went away (DMAGATHER_RECONNECT_S; 0: the job ends with it).
  int reconnect_s = 120;
};

// One tensor of an op as the caller passed it.
struct GatherItem {
  bool list = false;
  const void* send = nullptr;
  void* const* recvs = nullptr;  // 1 (flat) or world_size (list) pointers.
  size_t count = 0;
  dmagather_dtype_t dtype = DMAGATHER_UINT8;
  // An all-to-all (abi::kOpAllToAllV2 or a reduce-scatter's code; 0: an
  // all-gather as `list` says): recvs[0] is the output, chunk d of send is
  // at send + d*send_stride bytes, rank s's chunk lands at recvs[0] +
  // s*recv_stride; skip_self: this rank's own chunk is not moved.
  uint32_t a2a_op = 0;
  uint64_t send_stride = 0;
  uint64_t recv_stride = 0;
  bool skip_self = false;
};

class ReduceScatter;

// The bytes a descriptor's send and each of its outputs span.
void DescriptorSpans(const abi::DescriptorV2& d, int world, uint64_t* send_bytes, uint64_t* recv_bytes);

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
  absl::Status AllGatherList(const void* send, void* const* recvs, size_t count, dmagather_dtype_t dtype, void* stream);

  // all_to_all_single and reduce_scatter_tensor (comm_alltoall.cc).
  absl::Status AllToAll(const void* send, void* recv, size_t count, dmagather_dtype_t dtype, void* stream,
                        uint64_t* op);
  absl::Status ReduceScatterOp(const void* send, void* recv, size_t count, dmagather_dtype_t dtype, int redop,
                               void* stream, uint64_t* op);
  // OK when this rank can take part in an all-to-all on `stream`, else why
  // (FALLBACK: across nodes, an older daemon).
  absl::Status CheckAllToAll(void* stream, const char* what);
  // Whether `stream` is being captured into a CUDA graph.
  absl::StatusOr<bool> Capturing(void* stream) const;
  // The captured op `op`'s graph slot and that slot's generation (which
  // capture), taking its stream wait: the caller enqueues it
  // (ClientBackend::WaitGraphDone). An error when `op` was not captured or
  // its wait was taken.
  absl::StatusOr<std::pair<uint32_t, uint64_t>> TakeCapturedWait(uint64_t op);
  // Whether the graph captured into `slot` at `generation` still lives
  // (slots of destroyed graphs are reclaimed first).
  bool GraphLives(uint32_t slot, uint64_t generation);
  // This rank refuses its next op with `why` (its status on every rank).
  absl::Status Refuse(const absl::Status& why, uint64_t* op);

  absl::Status OpWait(uint64_t op);
  // OpWait of the op's copies alone (a reduce-scatter's sum aside); and
  // whether they are done.
  absl::Status OpWaitNoReduce(uint64_t op);
  absl::StatusOr<bool> OpDone(uint64_t op);
  absl::StatusOr<bool> OpTest(uint64_t op, absl::Status* op_status);
  absl::Status OpWaitStream(uint64_t op, void* stream);
  // Waits for every outstanding op; the first error since the last Wait.
  absl::Status Wait();
  // Leaves the job (after waiting for outstanding ops).
  absl::Status Close();

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const std::string& backend() const { return backend_name_; }
  // The host waits for ops (no stream ordering: the CPU backend).
  bool host_waits() const { return !backend_->has_stream_waits(); }
  const std::string& daemon_version() const { return daemon_version_; }
  uint32_t submitted() const { return static_cast<uint32_t>(ops_.submitted()); }

  // Publishes a hand-made v1 descriptor through the normal ring path (its
  // seq is set to the next one). For tests of the daemon's validation.
  absl::Status SubmitRawForTesting(const abi::DescriptorV1& d);

 private:
  explicit CommImpl(const CommOptions& options);
  absl::Status Join();
  // The region + offset of [ptr, ptr+bytes), registering unknown or reused
  // memory on the way where the backend allows it.
  absl::StatusOr<abi::BufferRefV1> Resolve(const void* ptr, uint64_t bytes, const char* what);
  // Registers the allocation described by `e` (dropping stale overlapping
  // registrations of freed-and-reused memory first).
  absl::Status RegisterExport(const MemoryExport& e, std::unique_ptr<OwnedBuffer> owned);
  // Fills `d` for one item (buffers resolved; on stream backends an
  // out-of-place own shard queued in own_copies_). Any error means this
  // rank refuses the op.
  absl::Status PrepareItem(const GatherItem& item, abi::DescriptorV2* d);
  absl::Status PrepareAllToAll(const GatherItem& item, abi::DescriptorV2* d);
  // The op's descriptors name no region dropped while the op was prepared.
  absl::Status RenameDropped(size_t n);
  // The checks before the items of an op: its size, the stream, and under
  // CUDA-graph capture a graph slot (*slot, else -1).
  absl::Status CheckOp(const GatherItem* items, size_t n, void* stream, int* slot);
  // Publishes `n` descriptors of op `seq` (items_following set here).
  absl::Status Publish(abi::DescriptorV2* ds, size_t n);
  absl::Status PublishRefusal(const absl::Status& why);
  // The capture path of Submit: defines a persistent op in graph `slot`
  // (items in scratch_), waits for its verdict, then enqueues the deferred
  // own-shard copies and the graph's ready write on `stream`.
  absl::Status SubmitCaptured(size_t n, void* stream, uint32_t slot, uint64_t* op);
  absl::Status CheckHealthy();  // Open, daemon alive, no job-ending error.
  // Checks that `op` names a submitted op; its 32-bit sequence number.
  absl::StatusOr<uint32_t> OpSeq(uint64_t op) const;
  std::string Rank() const;  // "rank N: "

  const CommOptions options_;
  std::string backend_name_;
  std::string daemon_version_;
  bool takes_alltoall_ = false;  // The daemon serves all-to-all ops (JoinReply).

  DoneFlag done_;  // Also: whether, and why, the daemon went away.

  common::MemfdMapping segment_;  // Keeps its memfd (sealed) for the session's life: a new daemon gets it too.
  abi::SegmentViewV1 view_;
  RingWriter ring_;

  uint32_t spin_ = 256;
  bool spin_set_ = false;  // By the options or $DMAGATHER_SPIN (else the daemon advises).
  OpTable ops_;
  bool closed_ = false;
  RegistrationCache regions_;
  std::vector<abi::DescriptorV2> scratch_;  // Descriptors of the op being submitted.
  // Regions RegisterExport dropped (id, client base) since Submit began: a
  // registration for a later item may replace a region an earlier item names
  // (VMM: the same first chunk, a longer range).
  std::vector<std::pair<uint32_t, uintptr_t>> dropped_;

  // The own-shard copies of the op being submitted: enqueued together once
  // every item is prepared (captured: after the capture's verdict).
  std::vector<OwnShardCopy> own_copies_;
  // CUDA-graph capture: the slots and captured ops.
  GraphSlots graphs_;
  // An op was captured: a new daemon could not take the job back (it does
  // not know the graphs' ops), so it ends with its daemon.
  std::atomic<bool> captured_{false};

  // After the pieces it works on (it stops its threads before they go).
  std::unique_ptr<DaemonLink> link_;

  // Declared last: released (stream registrations undone, owned memory
  // freed) before the segment goes.
  std::unique_ptr<ClientBackend> backend_;
  // Created at the first reduce-scatter; released at Close.
  std::unique_ptr<ReduceScatter> reduce_scatter_;
};

}  // namespace dmagather::client

// Job: the ranks of one training job on this node and the matcher that
// pairs their requests by sequence number. Each op lives in slot
// seq % kRingSlotsV1; a rank never has more than that many ops outstanding,
// so a busy slot means "not yet": the ingress thread leaves the descriptor
// in the ring (back-pressure) instead of queueing it elsewhere.
//
// Threads: ranks join on gRPC threads; SlotFor/Dispatch/Sweep/PollPersistent
// on the ingress thread; FinishOp on an engine thread, the ingress thread or
// (multi-node, through Op::PartDone) a ring thread (cluster/ring.h: a link's
// receive, send or control thread, the ticker); Fail from any of these and
// from the cluster layer's threads, FailAfter from a ring thread. Error
// records and done flags are written per rank in sequence order under
// completion_mu_.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/api_names.h"
#include "common/latency_histogram.h"
#include "server/engines/copy_engine.h"
#include "server/scheduler/op.h"
#include "server/scheduler/persistent_op.h"
#include "server/scheduler/rank.h"
#include "server/scheduler/remote.h"

namespace dmagather::server::scheduler {

struct JobCounters {
  std::atomic<uint64_t> ops{0};
  std::atomic<uint64_t> bytes{0};  // Payload bytes written into outputs.
  std::array<std::atomic<uint64_t>, common::kNumApiStatus> errors{};
  common::LatencyHistogram latency;       // First descriptor seen -> all done flags written.
  common::LatencyHistogram hop_latency;   // Last descriptor seen -> copies enqueued on the engine.
  std::atomic<uint64_t> fallback_ops{0};  // Ops the ranks' refusals turned into FALLBACK.
  // Ops whose done flags a device wrote after the copies; and rank-ops
  // whose done flag the CPU found already written when it came to publish
  // it (the rank's stream went on with no CPU in between).
  std::atomic<uint64_t> device_done_ops{0};
  std::atomic<uint64_t> done_before_cpu{0};
};

class Job {
 public:
  // `multi_node`: the job's ranks span nodes; it is complete once SetTopology
  // has been called (with the ring) and every local rank has joined.
  Job(std::string key, int world_size, uid_t uid, bool multi_node = false);
  ~Job();

  const std::string& key() const { return key_; }
  int world_size() const { return world_size_; }
  uid_t uid() const { return uid_; }

  // --- Join (gRPC threads) ---
  absl::Status AddRank(std::shared_ptr<Rank> rank) ABSL_LOCKS_EXCLUDED(mu_);
  void RemoveRank(const Rank* rank) ABSL_LOCKS_EXCLUDED(mu_);
  bool all_joined() const { return all_joined_.load(std::memory_order_acquire); }
  int joined() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<int> missing_ranks() const ABSL_LOCKS_EXCLUDED(mu_);
  // After all_joined(): the ranks, fixed for the job's life (null: on another node).
  Rank* rank(int r) const { return ranks_[r].get(); }
  std::vector<std::shared_ptr<Rank>> ranks() const ABSL_LOCKS_EXCLUDED(mu_);
  // Ranks on this node (all of them on a one-node job).
  int local_count() const { return local_count_.load(std::memory_order_acquire); }

  // --- Multi-node ---
  bool multi_node() const { return multi_node_; }
  // The ranks that joined here so far (ascending).
  std::vector<int> joined_ranks() const ABSL_LOCKS_EXCLUDED(mu_);
  // From the cluster layer once the coordinator's table is in and the ring
  // is up. Fails (and the job with it) when the table's local ranks are not
  // the ones that joined here.
  absl::Status SetTopology(std::shared_ptr<const Topology> topology, std::shared_ptr<RemotePart> remote)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Null on a one-node job / before SetTopology.
  const Topology* topology() const { return all_joined() ? topology_.get() : nullptr; }
  const RemotePart* remote() const { return all_joined() ? remote_.get() : nullptr; }

  // --- Failure: the first reason wins and fails every later op. ---
  void Fail(const absl::Status& status, int failed_rank) ABSL_LOCKS_EXCLUDED(mu_);
  // As Fail, for a failure that started on another node after its op
  // `spare` ended there: ops up to `spare` still complete normally here.
  void FailAfter(const absl::Status& status, uint32_t spare, int failed_rank = -1) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether op `seq` is spared by a FailAfter.
  bool Spared(uint32_t seq) const {
    return has_spare_.load(std::memory_order_acquire) && int32_t(seq - spare_.load(std::memory_order_acquire)) <= 0;
  }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // Before the ready flags of a rank that is gone are released (which lets
  // a device finish the job's ops on whatever the rank left, and write
  // their done flags): records `status` for every op whose done flags a
  // device writes and that has not ended, except those up to `spare` (ops
  // the leaving rank saw done), and from then on no op of the job has its
  // done flags written by a device. So no rank sees such an op done before
  // its error ("done on the device", Dispatch).
  void CloseDeviceDone(const absl::Status& status, int failed_rank, const uint32_t* spare)
      ABSL_LOCKS_EXCLUDED(completion_mu_);
  absl::Status failure() const ABSL_LOCKS_EXCLUDED(mu_);
  int failed_rank() const ABSL_LOCKS_EXCLUDED(mu_);

  // --- Matching (ingress thread) ---
  // The op for `seq`, set up if its slot was free; nullptr while the slot is
  // still held by an older op.
  Op* SlotFor(uint32_t seq, uint64_t now_ns);
  // Every rank's part has arrived: checks them, plans and starts the op on
  // `engine`, or fails it on every rank (refusal, invalid part, disagreement).
  void Dispatch(Op* op, engines::CopyEngine* engine);
  // Fails waiting ops if the job has failed, or fails the job when an op has
  // waited longer than op_timeout for its ranks.
  void Sweep(uint64_t now_ns, absl::Duration op_timeout);

  // --- Completion (any thread) ---
  // Records errors, publishes done flags in order, frees the slot.
  void FinishOp(Op* op, const absl::Status& status, int failed_rank) ABSL_LOCKS_EXCLUDED(completion_mu_);

  // --- Persistent (CUDA-graph captured) ops ---
  // Ingress thread: one look at every armed persistent op's ready flags;
  // starts those whose every rank replayed. Returns how many started.
  int PollPersistent(engines::CopyEngine* engine);
  bool has_persistent() const { return has_persistent_.load(std::memory_order_acquire); }
  size_t persistent_ops() const { return persistent_count_.load(std::memory_order_acquire); }
  // A replay went to the engine / came back (counts it in flight, so the
  // ranks' segments stay until it is done).
  void PersistentStarted();
  void PersistentFinished(uint64_t bytes, int32_t code);

  // --- Taking the job back from an earlier daemon (registry, gRPC threads) ---
  // A job created by a resuming Join (before any rank is added): its ranks
  // come back with their segments, and it is fed to the ingress thread only
  // once every local rank has registered again and called Resume.
  void MarkResuming() { resuming_.store(true, std::memory_order_release); }
  bool resuming() const { return resuming_.load(std::memory_order_acquire); }
  // A rank called Resume (once per session: the registry sees to it); true
  // for the last local rank, whose caller then calls StartAfter.
  bool RankResumed() { return resumed_ranks_.fetch_add(1, std::memory_order_acq_rel) + 1 == local_count(); }
  // Every local rank is back: `done` is the newest op any of them saw done.
  // Its data is complete on every rank (done is written only after an op's
  // copies ended, and error records before any rank's done flag: FinishOp),
  // so ops up to it are done on every rank from now on; the ranks' rings
  // are read from their next op, the ones up to `done` skipped.
  void StartAfter(uint32_t done) ABSL_LOCKS_EXCLUDED(completion_mu_);
  // A captured op a rank defined under an earlier daemon, from its Resume:
  // `seq` the definition's op, `part` its items resolved in the rank's
  // regions (graph_slot set).
  void AddCapturedDefinition(int rank, uint32_t seq, RankPart part) ABSL_LOCKS_EXCLUDED(mu_);
  // Before StartAfter(done), while no thread but the caller's touches the
  // job: re-arms every captured op all ranks defined up to `done`, and
  // settles what the earlier daemon left of its replay (PersistentOp::
  // TakeBack). Definitions after `done` come through the rings again.
  struct Rearmed {
    int ops = 0, run_again = 0, released = 0, dropped = 0;
  };
  Rearmed RearmCaptured(uint32_t done, const engines::CopyEngine& engine) ABSL_LOCKS_EXCLUDED(mu_);
  // A multi-node job coming back: which of its ranks are on this node (every
  // rank knows, from its first join); they must all agree. Join's reply
  // waits for them (local_joined), Resume for them all.
  absl::Status ExpectLocal(std::vector<int> ranks) ABSL_LOCKS_EXCLUDED(mu_);
  bool local_joined() const ABSL_LOCKS_EXCLUDED(mu_);
  // A multi-node job coming back: every local rank called Resume; `done`
  // is the newest op any of them saw done (what this node tells the
  // coordinator, which starts every node after the newest of all).
  void SetResumeReady(uint32_t done);
  bool resume_ready(uint32_t* done) const {
    *done = resume_done_.load(std::memory_order_acquire);
    return resume_ready_.load(std::memory_order_acquire);
  }

  // --- A multi-node job whose ring lost a node (cluster/ring.h) ---
  // Each joining rank says how long it waits for a daemon to take its job
  // back (DMAGATHER_RECONNECT_S); the job can be handed back only if every
  // local rank waits and no op is captured in a CUDA graph.
  void NoteReconnect(int seconds);
  // Instead of failing with `why` (a node died or its links did): the job
  // stops writing anything into its ranks' completion blocks (no done flag,
  // no error record: FinishOp), its ring aborts, and once no op runs the
  // registry hands it back to its ranks, which join again with resume, so
  // that every node forms the ring again and starts after the newest op
  // done anywhere. False (and nothing done) where the job cannot be.
  bool HandBack(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  bool handing_back() const { return handing_back_.load(std::memory_order_acquire); }
  absl::Status hand_back_why() const ABSL_LOCKS_EXCLUDED(mu_);
  // The registry took the job out (no op runs): its sessions end, telling
  // their ranks to join again.
  void MarkHandedBack() { handed_back_.store(true, std::memory_order_release); }
  bool handed_back() const { return handed_back_.load(std::memory_order_acquire); }

  // Waiting for its ranks' Resume (not yet fed to the ingress thread).
  bool awaiting_resume() const { return resuming() && !started_.load(std::memory_order_acquire); }
  // Op `seq` ended under the earlier daemon (its descriptors are skipped).
  bool HandedOverDone(uint32_t seq) const {
    return started_.load(std::memory_order_acquire) && int32_t(seq - start_after_) <= 0;
  }

  int ops_in_flight() const { return inflight_ops_.load(std::memory_order_acquire); }
  // Ops the engine runs now (not those waiting for ranks' parts).
  int ops_running() const;
  JobCounters counters;

 private:
  // This node's verdict on its ranks' parts: refusal, invalid part or
  // disagreement (and the rank it names), else OK.
  absl::Status LocalVerdict(Op* op, int* failed_rank);
  // Marks the job complete (under mu_, all local ranks present).
  void ActivateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string key_;
  const int world_size_;
  const uid_t uid_;
  const bool multi_node_;
  std::atomic<int> local_count_;
  std::shared_ptr<const Topology> topology_;  // Set once, before all_joined_.
  std::shared_ptr<RemotePart> remote_;        // Likewise.

  mutable absl::Mutex mu_;
  // Written under mu_ until all_joined_, then fixed and read without it (so
  // not ABSL_GUARDED_BY: rank(), FinishOp and the ingress read it unlocked).
  std::vector<std::shared_ptr<Rank>> ranks_;
  int joined_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> all_joined_{false};

  std::atomic<bool> resuming_{false};
  std::vector<int> expected_local_ ABSL_GUARDED_BY(mu_);  // A multi-node job coming back: its ranks here.
  std::atomic<bool> resume_ready_{false};
  std::atomic<uint32_t> resume_done_{0};
  std::atomic<int> min_reconnect_s_{-1};
  std::atomic<bool> handing_back_{false}, handed_back_{false};
  absl::Status hand_back_why_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> resumed_ranks_{0};
  // Captured ops' definitions from the ranks' Resume: by op, a part per rank.
  std::map<uint32_t, std::vector<RankPart>> resumed_defs_ ABSL_GUARDED_BY(mu_);
  uint32_t start_after_ = 0;  // Written once before started_ (release).
  std::atomic<bool> started_{false};

  std::atomic<bool> failed_{false};
  std::atomic<bool> has_spare_{false};
  std::atomic<uint32_t> spare_{0};
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  int failed_rank_ ABSL_GUARDED_BY(mu_) = -1;

  // Arms the op defined by `op` (every rank's part names a graph slot).
  absl::Status DefinePersistent(Op* op);

  std::vector<Op> slots_;
  std::vector<std::unique_ptr<PersistentOp>> persistent_;  // Ingress thread only.
  std::atomic<bool> has_persistent_{false};
  std::atomic<size_t> persistent_count_{0};
  std::atomic<int> inflight_ops_{0};
  // Orders the writes into the ranks' completion blocks (error records,
  // then done flags, each Rank's finished/next_publish) between the threads
  // that finish ops.
  absl::Mutex completion_mu_;
  bool device_done_closed_ ABSL_GUARDED_BY(completion_mu_) = false;
};

}  // namespace dmagather::server::scheduler

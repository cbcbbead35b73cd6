// Ring: the cross-node part of a multi-node job's ops (RemotePart).
//
// Nodes are ordered by the coordinator's table; node n sends to n+1 and
// receives from n-1 over `links` connections each way. For each op every
// node sends its verdict (a header frame: OK with the op's shape, or the
// refusal / invalid part) and, when OK, its block - the shards of its local
// ranks, cut into chunks, chunk c on link c % links. A node lands each
// received chunk straight into its first local rank's output, copies it to
// its other local ranks' outputs, and forwards it (from that output) unless
// the next node is the chunk's origin. So every node hears every node's
// verdict and ends the op the same way: OK, or the same FALLBACK /
// INVALID_ARGUMENT naming the rank, on every rank of every node.
//
// Ordering: a node starts sending op S only after its op S-1 has ended on
// every node (every frame of S-1 received and sent everywhere: the commit,
// ring_state.h), so on every link all frames of S-1 precede those of S, and
// no frame of S (a staged own chunk waits for its rank to reach S) is ever
// queued ahead of one S-1 still needs.
//
// Ending: when a node's job fails (a rank left or died, a link broke, an op
// timed out), it sends an abort frame on every link, both ways round the
// ring, after what it already sent, naming the newest op that ended there
// (`spare`): everything of the ops up to it is already on the wire, so a
// neighbour first ends its own ops up to `spare` from the frames in flight,
// then fails the job with the origin's reason and passes the abort on. So
// the end of a job (its ranks leave one node before the last frames reach
// the next) loses nothing. A receive thread that meets a frame of an op its
// node has not started yet waits for it (its ranks will submit it: nothing
// they wait for is behind it), and never waits for a send - sends go
// through per-link queues and threads - so the ring cannot deadlock.
//
// Failure: which op is where, which node is blamed and who must hear it is
// RingState's (ring_state.h); this class moves the bytes. A link that
// breaks, or a next node whose heartbeats stop, fails the job with
// PEER_FAILED naming the node, and the abort (naming it too, and sparing
// nothing) goes both ways round the ring, so every surviving node fails at
// once. An op that stays incomplete past the op timeout fails the job with
// TIMEOUT naming the nodes it waits for (Job::Sweep).
//
// Threads: Start/Pending on the ingress thread; per link one receive thread
// (previous side), one send thread and one control reader (next side); one
// ticker (heartbeats back, silent links; abort frames back); Abort from any
// thread; one mutex (mu_) for the state, the send queues and the staging
// buffers (the annotations below say which; clang checks them,
// tools/check_thread_safety.sh).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/latency_histogram.h"
#include "server/cluster/frame.h"
#include "server/cluster/ring_state.h"
#include "server/engines/copy_engine.h"
#include "server/scheduler/job.h"
#include "server/scheduler/remote.h"
#include "server/transport/transport.h"

namespace dmagather::server::cluster {

struct RingOptions {
  uint64_t chunk_bytes = 1 << 20;
  // Rank memory the daemon cannot address directly (GPU backends) is staged
  // through pinned host memory of the engine, at most this much per job.
  engines::CopyEngine* engine = nullptr;
  uint64_t transit_bytes = uint64_t{4} << 30;
  bool force_staging = false;  // Stage even where rank memory is host memory (tests the GPU path on CPU).
  std::string transport = "tcp";
  std::string transport_reason;
  // Heartbeats and silent-peer detection (RingStateOptions).
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration peer_timeout = absl::Seconds(5);
  const common::Clock* clock = &common::RealClock();
};

class Ring : public scheduler::RemotePart {
 public:
  Ring(scheduler::Job* job, std::shared_ptr<const scheduler::Topology> topology,
       std::vector<std::unique_ptr<transport::Connection>> to_next,
       std::vector<std::unique_ptr<transport::Connection>> from_prev, RingOptions options);
  ~Ring() override;

  // Starts the link threads.
  void Run();
  void Start(scheduler::Op* op, const absl::Status& local_verdict, int failed_rank) override ABSL_LOCKS_EXCLUDED(mu_);
  void Abort(const absl::Status& why) override ABSL_LOCKS_EXCLUDED(mu_);
  std::string Pending(uint32_t seq) const override ABSL_LOCKS_EXCLUDED(mu_);
  void Close() override ABSL_LOCKS_EXCLUDED(mu_);
  scheduler::RemoteStats stats() const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Send {
    RingFrameV1 frame;
    const char* payload;
    int link;
    // Staged own chunk: copied from this rank memory into `payload` (host)
    // first, once the rank has reached op `frame.seq`.
    const char* stage_src = nullptr;
    const engines::EngineRank* stage_rank = nullptr;
    bool ready_known = false;  // A graph replay: the ranks' flags were seen already.
  };
  struct Link {
    std::unique_ptr<transport::Connection> conn;
    absl::CondVar cv;            // Its SendQueue has work / the ring aborts or closes.
    std::thread thread;          // Sends the queue (forwards).
    std::thread control_thread;  // Reads heartbeats and aborts (backwards).
  };
  // A link's frames still to send (guarded by mu_: `send_queues_`).
  struct SendQueue {
    std::deque<Send> frames;
    bool send_abort = false;  // Still has to send the abort frame.
  };
  // What the state machine leaves to the data path, per op slot.
  struct SlotData {
    scheduler::Op* op = nullptr;
    std::vector<Send> own;  // Own frames (header first) until released.
    uint64_t started_ns = 0;
    // Landing: per item its bytes, and (staged) where its block starts in `staging`.
    std::vector<uint64_t> item_bytes, item_base;
    char* staging = nullptr;  // Staged: pinned host copy of the op's output (item_base[i] + rank * bytes).
    uint64_t staging_bytes = 0;
  };
  // What to do outside mu_ after a RingState call: end ops, fail the job.
  struct Ended {
    scheduler::Op* op;
    absl::Status status;
    int failed_rank;
  };
  struct Outcome {
    std::vector<Ended> ended;
    bool fail = false, fail_after = false;
    bool blamed = false;  // A node is blamed (died, or its links did): the job may be handed back.
    absl::Status fail_status;
    uint32_t spare = 0;
  };

  static RingStateOptions StateOptions(const scheduler::Topology& topo, int links, const RingOptions& o);
  void SendLoop(int link) ABSL_LOCKS_EXCLUDED(mu_);
  void RecvLoop(int link) ABSL_LOCKS_EXCLUDED(mu_);
  void ControlLoop(int link) ABSL_LOCKS_EXCLUDED(mu_);
  void TickLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Carries out what the state machine asked for (`payload`: the landed
  // chunk a forward of it is sent from).
  void ApplyLocked(RingState::Effects& fx, Outcome* out, const char* payload = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the ops and fails the job as `out` says (calls into the job).
  void Deliver(Outcome& out) ABSL_LOCKS_EXCLUDED(mu_);
  void QueueLocked(int link, const Send& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether an abort frame is still to be sent on some link.
  bool AbortFramesPendingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A chunk (OnFrame said kChunk): lands its payload; false when the ring
  // stopped reading this link.
  bool LandChunk(int link, const RingFrameV1& f, std::vector<char>* scratch) ABSL_LOCKS_EXCLUDED(mu_);
  void OnLinkError(RingState::Side side, int link, const absl::Status& st) ABSL_LOCKS_EXCLUDED(mu_);
  void BuildOwnFrames(scheduler::Op* op, uint32_t idx, RingFrameV1* header) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where chunk (item, rank, offset, len) of the op in `d` lands in local
  // rank `l`'s output.
  char* Dest(const SlotData& d, int l, const RingFrameV1& f) const;
  // Staged: where the chunk lands in the slot's host staging.
  char* StagingDest(const SlotData& d, const RingFrameV1& f) const;
  bool Fits(const SlotData& d, const RingFrameV1& f) const;
  // Staging of at least `bytes` for `d` within the transit budget.
  absl::Status EnsureStagingLocked(SlotData& d, uint32_t seq, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StagingFailed(const absl::Status& st) ABSL_LOCKS_EXCLUDED(mu_);
  int next_node() const { return (topo_->my_node + 1) % topo_->num_nodes(); }
  int prev_node() const { return (topo_->my_node + topo_->num_nodes() - 1) % topo_->num_nodes(); }

  scheduler::Job* const job_;
  const std::shared_ptr<const scheduler::Topology> topo_;
  const RingOptions options_;
  const bool staged_;  // Rank memory is not host memory here: land in staging, copy in.
  mutable absl::Mutex mu_;
  uint64_t staging_total_ ABSL_GUARDED_BY(mu_) = 0;  // Staging allocated (in slots and spare).
  std::vector<std::pair<char*, uint64_t>> spare_staging_ ABSL_GUARDED_BY(mu_);  // Buffers no slot holds.
  std::vector<Link> next_;
  std::vector<SendQueue> send_queues_ ABSL_GUARDED_BY(mu_);  // Per link of next_.
  std::vector<std::unique_ptr<transport::Connection>> prev_;
  std::vector<std::thread> recv_threads_;
  std::thread tick_thread_;

  RingState state_ ABSL_GUARDED_BY(mu_);
  // Per slot. A chunk lands through a SlotData* taken under mu_ and used
  // unlocked: the slot cannot end (nor be reused) while the chunk is uncounted.
  std::vector<SlotData> data_ ABSL_GUARDED_BY(mu_);
  absl::CondVar slot_cv_;                              // A slot was started / the ring aborted.
  absl::CondVar tick_cv_;                              // The ticker has an abort to send back / the ring closes.
  bool send_abort_prev_ ABSL_GUARDED_BY(mu_) = false;  // The ticker still has to send the abort frame back.
  // After an abort: gives the links a moment to carry the abort frames,
  // then shuts every connection (a cut link would hold a thread for long).
  std::thread abort_thread_;
  absl::CondVar close_cv_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> stop_waits_{false};  // Ends staging's waits for ranks' ready flags.

  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0}, frames_sent_{0}, frames_received_{0}, ops_{0}, busy_ns_{0};
  common::LatencyHistogram chunk_ns_;
};

}  // namespace dmagather::server::cluster

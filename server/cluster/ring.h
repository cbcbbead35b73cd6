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
// Ordering: a node starts sending op S only after its op S-1 has ended
// (every frame of S-1 received and sent), so on every link all frames of
// S-1 precede those of S.
//
// Ending: when a node's job fails (a rank left or died, a link broke, an op
// timed out), it sends an abort frame on every link, after what it already
// sent, naming the newest op that ended there (`spare`): everything of the
// ops up to it is already on the wire, so the next node first ends its own
// ops up to `spare` from the frames in flight, then fails the job with the
// origin's reason and forwards the abort. So the end of a job (its ranks
// leave one node before the last frames reach the next) loses nothing. A receive thread that meets a frame of an op its
// node has not started yet waits for it (its ranks will submit it: nothing
// they wait for is behind it), and never waits for a send - sends go
// through per-link queues and threads - so the ring cannot deadlock.
//
// Failure: a link that breaks (peer daemon killed, cable cut: keepalive and
// TCP_USER_TIMEOUT bound it) fails the job with PEER_FAILED naming the
// node; the node sends an abort frame on, so every node fails its ops with
// the same reason. An op that stays incomplete past the op timeout fails
// the job with TIMEOUT naming the nodes it waits for (Job::Sweep).
//
// Threads: Start/Pending on the ingress thread; one receive and one send
// thread per link; Abort from any thread; one mutex (mu_) for the state.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/latency_histogram.h"
#include "server/cluster/frame.h"
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
};


class Ring : public scheduler::RemotePart {
 public:
  Ring(scheduler::Job* job, std::shared_ptr<const scheduler::Topology> topology,
       std::vector<std::unique_ptr<transport::Connection>> to_next,
       std::vector<std::unique_ptr<transport::Connection>> from_prev, RingOptions options);
  ~Ring() override;

  // Starts the link threads.
  void Run();
  void Start(scheduler::Op* op, const absl::Status& local_verdict, int failed_rank) override;
  void Abort(const absl::Status& why) override;
  std::string Pending(uint32_t seq) const override;
  void Close() override;
  scheduler::RemoteStats stats() const override;

 private:
  struct Send {
    RingFrameV1 frame;
    const char* payload;
    uint32_t slot;
    int link;
    // Staged own chunk: copied from this rank memory into `payload` (host)
    // first, once the rank has reached op `frame.seq`.
    const char* stage_src = nullptr;
    const engines::EngineRank* stage_rank = nullptr;
    bool ready_known = false;  // A graph replay: the ranks' flags were seen already.
  };
  struct Link {
    std::unique_ptr<transport::Connection> conn;
    std::deque<Send> queue;  // Under mu_.
    std::condition_variable cv;
    std::thread thread;
    bool sending = false;     // Under mu_: a Send is in progress.
    bool send_abort = false;  // Under mu_: still has to send abort_frame_.
  };
  // One op (seq % slots).
  struct Slot {
    uint32_t seq = 0;
    bool active = false;    // Started here and not ended.
    bool released = false;  // Its own frames are queued (op S-1 ended).
    scheduler::Op* op = nullptr;
    bool local_ok = false;
    std::vector<RingFrameV1> headers;  // Per node.
    std::vector<char> have;
    int have_count = 0;
    uint64_t chunks_expected = 0, chunks_got = 0;
    int sends_pending = 0;
    int busy = 0;         // Frames of it being written or landed right now (outside mu_).
    bool doomed = false;  // Aborted while busy: ends when busy drops to 0.
    std::vector<Send> own;  // Own frames until released.
    uint64_t started_ns = 0;
    // Landing: per item its bytes, and (staged) where its block starts in `staging`.
    std::vector<uint64_t> item_bytes, item_base;
    char* staging = nullptr;  // Staged: pinned host copy of the op's output (item_base[i] + rank * bytes).
    uint64_t staging_bytes = 0;
  };

  void SendLoop(int link);
  void RecvLoop(int link);
  // Under mu_: queues `s` (counted in its slot's sends_pending).
  void QueueLocked(int link, const Send& s);
  // An op whose ring part ended, and how (PartDone is called outside mu_);
  // op == nullptr: fail the job with `status` (a pending abort is due),
  // sparing ops up to `spare`.
  struct Ended {
    scheduler::Op* op;
    absl::Status status;
    int failed_rank;
    uint32_t spare = 0;
  };
  // Under mu_: ends the op when everything is in and out, and releases the
  // next op's own frames.
  void MaybeEndLocked(uint32_t index, std::vector<Ended>* ended);
  void Deliver(std::vector<Ended>& ended);
  void ReleaseLocked(Slot& s);
  // Under mu_: a frame of `s` is done being written or landed.
  void UnbusyLocked(Slot& s, std::vector<Ended>* ended);
  bool SpareEndedLocked() const { return any_started_ ? int32_t(last_ended_ - spare_) >= 0 : spare_ == 0; }
  absl::Status VerdictLocked(const Slot& s, int* failed_rank) const;
  // Where chunk (item, rank, offset, len) of `s` lands in local rank `l`'s
  // output; null when the frame does not fit this node's shape.
  char* Dest(const Slot& s, int l, const RingFrameV1& f) const;
  // Staged: where the chunk lands in the slot's host staging.
  char* StagingDest(const Slot& s, const RingFrameV1& f) const;
  bool Fits(const Slot& s, const RingFrameV1& f) const;
  // Under mu_: staging of at least `bytes` for `s` within the transit budget.
  absl::Status EnsureStagingLocked(Slot& s, uint64_t bytes);
  void StagingFailed(const absl::Status& st);
  void LinkFailed(const std::string& why);
  int next_node() const { return (topo_->my_node + 1) % topo_->num_nodes(); }
  int prev_node() const { return (topo_->my_node + topo_->num_nodes() - 1) % topo_->num_nodes(); }

  scheduler::Job* const job_;
  const std::shared_ptr<const scheduler::Topology> topo_;
  const RingOptions options_;
  const bool staged_;  // Rank memory is not host memory here: land in staging, copy in.
  uint64_t staging_total_ = 0;  // Under mu_: staging allocated (in slots and spare).
  std::vector<std::pair<char*, uint64_t>> spare_staging_;  // Under mu_: buffers no slot holds.
  std::vector<Link> next_;
  std::vector<std::unique_ptr<transport::Connection>> prev_;
  std::vector<std::thread> recv_threads_;

  mutable std::mutex mu_;
  std::condition_variable slot_cv_;  // A slot was started / the ring aborted.
  std::vector<Slot> slots_;
  uint32_t last_ended_ = 0;  // Seq of the newest op ended here (ops end in order).
  bool any_started_ = false;
  bool aborted_ = false;
  absl::Status abort_why_;
  int abort_origin_ = -1;  // Node an abort frame came from (-1: failed here).
  // An abort frame came: the origin's ops up to spare_ ended there, so ours
  // may still complete from frames in flight; the job fails once they have.
  bool pending_abort_ = false;
  absl::Status pending_why_;
  uint32_t spare_ = 0;
  RingFrameV1 abort_frame_{};
  // After an abort: gives the links a moment to carry the abort frames,
  // then shuts every connection (a cut link would hold a thread for long).
  std::thread abort_thread_;
  std::condition_variable close_cv_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> stop_waits_{false};  // Ends staging's waits for ranks' ready flags.

  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0}, frames_sent_{0}, frames_received_{0}, ops_{0},
      busy_ns_{0};
  common::LatencyHistogram chunk_ns_;
};

}  // namespace dmagather::server::cluster

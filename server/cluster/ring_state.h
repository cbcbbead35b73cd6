// RingState: the ring's per-op state machine, apart from its threads and
// sockets (Ring drives it under its mutex; tests drive it directly).
//
// It holds, per op slot, every node's verdict header, the chunk accounting
// (expected / received / frames still to send / frames being written or
// landed right now), and for the ring as a whole the abort state and which
// node is blamed. Every call takes the event (a frame arrived, a frame was
// sent, a link broke, time passed) and says what to do in `Effects`: which
// ops' own frames go out now, which frames to forward, which ops ended and
// how, whether the job fails, whether abort frames go out and on which side.
// No threads, no sockets; time comes from the Clock.
//
// Commit: an op ends here (its done flags may be written) only once every
// node has ended it locally - all its data landed everywhere - which each
// node says with an "ended" frame that goes once round the ring. So an op
// any rank saw done needs nothing of any node's inputs again, and a ring
// that lost a node can be formed again after the newest op done anywhere
// (docs/ARCHITECTURE.md, "Daemon restarts").
//
// Failure detection (see docs/ARCHITECTURE.md, "Multi-node"):
//  - A link that breaks (read or write fails, the peer closed it) fails the
//    job with PEER_FAILED naming the node at the other end.
//  - Every link also carries control frames backwards (receiver to sender):
//    heartbeats every `heartbeat_interval`, and abort frames. The sender side
//    always reads that direction (nothing else is on it, so nothing queues
//    ahead of a control frame): a next node whose heartbeats stop for
//    `peer_timeout` (a host that lost power, a cut cable: no FIN) is failed.
//  - An abort goes both ways round the ring (forwards on the next links,
//    backwards on the previous ones), so every surviving node hears it even
//    though the failed node cuts the ring: the dead node's predecessor
//    reaches the others backwards, its successor forwards.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/cluster/frame.h"

namespace dmagather::server::cluster {

struct RingStateOptions {
  int num_nodes = 2;
  int my_node = 0;
  int links = 1;
  int slots = 16;
  std::vector<std::string> node_names;       // "host address", for messages.
  std::vector<std::vector<int>> node_ranks;  // Per node, for messages.
  uint64_t chunk_bytes = 1 << 20;            // Largest data frame accepted.
  // Heartbeats back to the previous node; a next node silent this long is
  // failed (zero: no heartbeats, no silence detection).
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration peer_timeout = absl::Seconds(5);
};

class RingState {
 public:
  // Which side of this node a link is on.
  enum class Side { kPrev, kNext };

  struct Ended {
    uint32_t seq;
    absl::Status status;
    int failed_rank;
  };
  struct Effects {
    std::vector<uint32_t> release;                     // Ops whose own frames go out now, in order.
    std::vector<std::pair<int, RingFrameV1>> forward;  // (link, frame) to queue to the next node.
    std::vector<Ended> ended;                          // Ops whose ring part ended.
    bool fail = false;                                 // Fail the job with fail_status ...
    absl::Status fail_status;
    bool fail_after = false;  // ... sparing ops up to fail_spare.
    uint32_t fail_spare = 0;
    bool drop_queued = false;                               // Abort: frames not yet written are dropped.
    bool send_abort_next = false, send_abort_prev = false;  // abort_frame() goes out that side.
    std::vector<int> heartbeats;                            // Previous-side links a heartbeat goes back on.
  };

  // What Ring does with a frame read from the previous node.
  enum class Frame {
    kMalformed,  // The job failed (Effects); stop reading.
    kStop,       // Aborted, or an abort frame: nothing follows on this link.
    kWait,       // Its op has not started here: wait for Start, then offer it again.
    kDone,       // Handled (a header, a heartbeat).
    kChunk,      // A chunk: land its payload (or skip it), then ChunkDone / ChunkFailed.
  };

  RingState(RingStateOptions options, const common::Clock& clock);

  const RingStateOptions& options() const { return o_; }
  int next_node() const { return (o_.my_node + 1) % o_.num_nodes; }
  int prev_node() const { return (o_.my_node + o_.num_nodes - 1) % o_.num_nodes; }
  std::string NodeName(int node) const;

  // An op started here: its verdict header (type kFrameHeader, origin me)
  // and how many data frames of its own it sends.
  void Start(uint32_t seq, const RingFrameV1& header, uint64_t own_chunks, Effects* fx);
  bool local_ok(uint32_t seq) const { return slot(seq).local_ok; }
  // Op `seq` ended here and waits for the other nodes to say they ended it.
  bool local_ended(uint32_t seq) const {
    const Slot& s = slot(seq);
    return s.active && s.seq == seq && s.local_ended;
  }

  Frame OnFrame(int link, const RingFrameV1& f, Effects* fx);
  // The payload of chunk `f` (OnFrame said kChunk) is landed (`landed`) or
  // skipped (this node could not place it: forwarded as a skip).
  void ChunkDone(int link, const RingFrameV1& f, bool landed, Effects* fx);
  // Reading or placing its payload failed; the caller then fails the link
  // (LinkFailed) or the job.
  void ChunkFailed(uint32_t seq, Effects* fx);

  // A control frame from the next node (heartbeat or abort, read on the
  // backward direction of a next-side link).
  void OnControl(int link, const RingFrameV1& f, Effects* fx);

  // A frame of op `seq` is being written (outside the lock) / was written.
  void SendBegin(uint32_t seq);
  void SendDone(uint32_t seq, bool ok, Effects* fx);

  // A link on `side` broke (`why`: what the transport said).
  void LinkFailed(Side side, int link, const std::string& why, Effects* fx);
  // The job failed (here or elsewhere): every op in flight ends with `why`.
  void Abort(const absl::Status& why, Effects* fx);
  // Time passed: heartbeats due, silent next links.
  void Tick(Effects* fx);

  bool aborted() const { return aborted_; }
  const absl::Status& abort_why() const { return abort_why_; }
  // The frame Abort sends (valid once aborted()).
  const RingFrameV1& abort_frame() const { return abort_frame_; }
  // The node this node blames (-1: none known).
  int dead_node() const { return dead_node_; }
  // What op `seq` still waits for, "" if nothing.
  std::string Pending(uint32_t seq) const;
  // Heartbeat frame (what Ring sends backwards).
  RingFrameV1 HeartbeatFrame() const;
  // The Clock's now, in ns (for when a wait is due).
  uint64_t NowNs() const { return clock_.NowNs(); }
  // When Tick next has something to do (ns on the Clock; 0: never).
  uint64_t NextTickNs() const;

 private:
  struct Slot {
    uint32_t seq = 0;
    bool active = false;
    bool released = false;
    bool local_ok = false;
    std::vector<RingFrameV1> headers;
    std::vector<char> have;
    int have_count = 0;
    uint64_t own_chunks = 0;
    uint64_t chunks_expected = 0, chunks_got = 0;
    int64_t sends_pending = 0;
    int busy = 0;
    bool doomed = false;
    // Ended here (everything landed, every frame out); the verdict waits
    // for the other nodes' "ended" frames.
    bool local_ended = false;
    absl::Status verdict;
    int verdict_rank = -1;
    std::vector<char> ended_from;
    int ended_count = 0;
  };
  Slot& slot(uint32_t seq) { return slots_[seq % slots_.size()]; }
  const Slot& slot(uint32_t seq) const { return slots_[seq % slots_.size()]; }
  void Release(Slot& s, Effects* fx);
  void MaybeEnd(Slot& s, Effects* fx);
  // Ends the op once every node ended it (or it is spared by an abort).
  void MaybeCommit(Slot& s, Effects* fx);
  // An abort that spares ops up to `spare`: those ended here end now.
  void CommitSpared(uint32_t spare, Effects* fx);
  void FailSparing(Effects* fx);
  void Unbusy(Slot& s, Effects* fx);
  absl::Status Verdict(const Slot& s, int* failed_rank) const;
  bool SpareEnded() const { return any_started_ ? int32_t(last_ended_ - spare_) >= 0 : spare_ == 0; }
  void OnAbortFrame(Side from, const RingFrameV1& f, Effects* fx);
  void Fail(const absl::Status& st, Effects* fx);
  bool Malformed(const RingFrameV1& f) const;

  const RingStateOptions o_;
  const common::Clock& clock_;
  std::vector<Slot> slots_;
  uint32_t last_ended_ = 0;      // Newest op ended here (all its data landed).
  uint32_t last_committed_ = 0;  // Newest op ended on every node (its own frames release the next op's).
  bool any_started_ = false;
  bool aborted_ = false;
  absl::Status abort_why_;
  RingFrameV1 abort_frame_{};
  int dead_node_ = -1;
  // An abort frame came: its origin's ops up to spare_ ended there, so ours
  // may still complete from frames in flight; the job fails once they have.
  bool pending_ = false;
  absl::Status pending_why_;
  uint32_t spare_ = 0;
  int abort_origin_ = -1;
  Side abort_from_ = Side::kPrev;
  bool failing_ = false;           // Effects already asked to fail the job.
  std::vector<char> prev_closed_;  // Previous-side links that ended (after an abort frame).
  // Heartbeats: when each next-side link was last heard from, when each
  // previous-side link last carried one back.
  std::vector<uint64_t> next_heard_ns_, prev_beat_ns_;
};

// A frame with the fixed fields set.
RingFrameV1 NewRingFrame(uint16_t type, uint32_t seq, int origin);
void SetFrameText(RingFrameV1* f, const std::string& text);

}  // namespace dmagather::server::cluster

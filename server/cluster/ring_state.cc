#include "server/cluster/ring_state.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/api_names.h"

namespace dmagather::server::cluster {

RingFrameV1 NewRingFrame(uint16_t type, uint32_t seq, int origin) {
  RingFrameV1 f;
  memset(&f, 0, sizeof(f));
  f.magic = kRingMagic;
  f.version = kRingVersion;
  f.type = type;
  f.seq = seq;
  f.origin = origin;
  f.failed_rank = -1;
  return f;
}

void SetFrameText(RingFrameV1* f, const std::string& t) {
  const size_t n = std::min(t.size(), sizeof(f->text) - 1);
  memcpy(f->text, t.data(), n);
  f->text[n] = '\0';
}

RingState::RingState(RingStateOptions options, const common::Clock& clock)
    : o_(std::move(options)),
      clock_(clock),
      slots_(o_.slots),
      prev_closed_(o_.links, 0),
      next_heard_ns_(o_.links, clock.NowNs()),
      prev_beat_ns_(o_.links, 0) {
  for (Slot& s : slots_) {
    s.headers.resize(o_.num_nodes);
    s.have.resize(o_.num_nodes);
    s.ended_from.resize(o_.num_nodes);
  }
}

std::string RingState::NodeName(int node) const {
  if (node < 0 || node >= int(o_.node_names.size())) return absl::StrCat("node ", node);
  return absl::StrCat("node ", node, " (", o_.node_names[node], ")");
}

void RingState::Start(uint32_t seq, const RingFrameV1& header, uint64_t own_chunks, Effects* fx) {
  Slot& s = slot(seq);
  s.seq = seq;
  std::fill(s.have.begin(), s.have.end(), 0);
  s.have_count = 1;
  s.chunks_expected = s.chunks_got = 0;
  s.sends_pending = 0;
  s.released = false;
  s.own_chunks = own_chunks;
  s.local_ended = false;
  s.verdict = absl::OkStatus();
  s.verdict_rank = -1;
  std::fill(s.ended_from.begin(), s.ended_from.end(), 0);
  s.ended_count = 0;
  s.local_ok = header.code == 0;
  s.headers[o_.my_node] = header;
  s.have[o_.my_node] = 1;
  if (aborted_) {
    fx->ended.push_back(Ended{seq, abort_why_, -1});
    return;
  }
  s.active = true;
  if (!any_started_ || seq == last_committed_ + 1) Release(s, fx);
  any_started_ = true;
}

void RingState::Release(Slot& s, Effects* fx) {
  s.sends_pending += int64_t(1 + s.own_chunks);  // The header and its own chunks.
  s.released = true;
  fx->release.push_back(s.seq);
}

bool RingState::Malformed(const RingFrameV1& f) const {
  const bool data = f.type == kFrameData;
  return f.magic != kRingMagic || f.version != kRingVersion || f.origin < 0 || f.origin >= o_.num_nodes ||
         f.origin == o_.my_node || (data && f.len > o_.chunk_bytes) ||
         (f.type != kFrameHeader && !data && f.type != kFrameSkip && f.type != kFrameAbort &&
          f.type != kFrameHeartbeat && f.type != kFrameEnded);
}

RingState::Frame RingState::OnFrame(int link, const RingFrameV1& f, Effects* fx) {
  if (Malformed(f)) {
    if (!aborted_ && !failing_) dead_node_ = prev_node();
    Fail(absl::AbortedError(
             absl::StrCat(NodeName(prev_node()), " failed: it sent a malformed ring frame on link ", link)),
         fx);
    return Frame::kMalformed;
  }
  if (f.type == kFrameHeartbeat) return Frame::kDone;
  if (f.type == kFrameAbort) {
    OnAbortFrame(Side::kPrev, f, fx);
    return Frame::kStop;  // Nothing follows an abort frame on its link.
  }
  if (aborted_) return Frame::kStop;
  Slot& s = slot(f.seq);
  if (!s.active || s.seq != f.seq) return Frame::kWait;
  if (f.type == kFrameData) {
    ++s.busy;  // The slot cannot end (nor be failed) while its payload lands.
    return Frame::kChunk;
  }
  if (f.type == kFrameEnded) {
    if (!s.ended_from[f.origin]) {
      s.ended_from[f.origin] = 1;
      ++s.ended_count;
      if (next_node() != f.origin) {
        fx->forward.emplace_back(0, f);
        ++s.sends_pending;
      }
    }
    MaybeCommit(s, fx);
    return Frame::kDone;
  }
  if (f.type == kFrameHeader) {
    if (!s.have[f.origin]) {
      s.have[f.origin] = 1;
      ++s.have_count;
      s.headers[f.origin] = f;
      s.chunks_expected += f.chunks;
    }
    if (next_node() != f.origin) {
      fx->forward.emplace_back(link, f);
      ++s.sends_pending;
    }
  } else {  // kFrameSkip
    ++s.chunks_got;
    if (next_node() != f.origin) {
      fx->forward.emplace_back(link, f);
      ++s.sends_pending;
    }
  }
  MaybeEnd(s, fx);
  return Frame::kDone;
}

void RingState::ChunkDone(int link, const RingFrameV1& f, bool landed, Effects* fx) {
  Slot& s = slot(f.seq);
  Unbusy(s, fx);
  if (aborted_) return;
  ++s.chunks_got;
  if (next_node() != f.origin) {
    RingFrameV1 fw = f;
    if (!landed) {
      fw.type = kFrameSkip;
      fw.len = 0;
    }
    fx->forward.emplace_back(link, fw);
    ++s.sends_pending;
  }
  MaybeEnd(s, fx);
}

void RingState::ChunkFailed(uint32_t seq, Effects* fx) { Unbusy(slot(seq), fx); }

void RingState::SendBegin(uint32_t seq) { ++slot(seq).busy; }

void RingState::SendDone(uint32_t seq, bool ok, Effects* fx) {
  Slot& s = slot(seq);
  Unbusy(s, fx);
  if (!ok || aborted_) return;
  --s.sends_pending;
  MaybeEnd(s, fx);
}

void RingState::Unbusy(Slot& s, Effects* fx) {
  if (--s.busy == 0 && s.doomed) {
    s.doomed = false;
    fx->ended.push_back(Ended{s.seq, abort_why_, -1});
  }
}

void RingState::MaybeEnd(Slot& s, Effects* fx) {
  if (!s.active) return;
  if (s.local_ended) {
    MaybeCommit(s, fx);
    return;
  }
  if (!s.released || s.have_count != o_.num_nodes || s.chunks_got != s.chunks_expected || s.sends_pending != 0) {
    return;
  }
  // Ended here: every node's data landed, every frame went out. The
  // verdict (and the next op's own frames) wait for every node to say so.
  s.verdict = Verdict(s, &s.verdict_rank);
  s.local_ended = true;
  last_ended_ = s.seq;
  RingFrameV1 ended = NewRingFrame(kFrameEnded, s.seq, o_.my_node);
  fx->forward.emplace_back(0, ended);  // One link, so "ended" frames keep their order.
  ++s.sends_pending;
  if (pending_ && !aborted_ && SpareEnded()) {
    FailSparing(fx);
    return;
  }
  MaybeCommit(s, fx);
}

void RingState::MaybeCommit(Slot& s, Effects* fx) {
  if (!s.active || !s.local_ended || s.sends_pending != 0) return;
  const bool spared = pending_ && int32_t(s.seq - spare_) <= 0;
  if (s.ended_count != o_.num_nodes - 1 && !spared) return;
  s.active = false;
  fx->ended.push_back(Ended{s.seq, s.verdict, s.verdict_rank});
  // Only now the next op's own frames go out: a staged own chunk waits, in
  // its link's send thread, for its rank to reach that op - which a rank
  // whose stream waits for this op's done flag does only once this op is
  // done. Queued earlier, it could hold up an "ended" frame of this op
  // behind it, and nothing would end.
  last_committed_ = s.seq;
  Slot& next = slot(s.seq + 1);
  if (next.active && next.seq == s.seq + 1 && !next.released) Release(next, fx);
}

void RingState::CommitSpared(uint32_t spare, Effects* fx) {
  // In sequence order from the oldest, as done flags are written.
  std::vector<Slot*> spared;
  for (Slot& s : slots_) {
    if (s.active && s.local_ended && int32_t(s.seq - spare) <= 0) spared.push_back(&s);
  }
  std::sort(spared.begin(), spared.end(), [](const Slot* a, const Slot* b) { return int32_t(a->seq - b->seq) < 0; });
  for (Slot* s : spared) {
    s->active = false;
    fx->ended.push_back(Ended{s->seq, s->verdict, s->verdict_rank});
  }
}

void RingState::FailSparing(Effects* fx) {
  // The abort's origin ended the spared ops, and so did this node: every
  // node that could still need them has them (the job is ending anyway).
  CommitSpared(spare_, fx);
  Fail(pending_why_, fx);
  fx->fail_after = true;
  fx->fail_spare = spare_;
}

absl::Status RingState::Verdict(const Slot& s, int* failed_rank) const {
  const int n = o_.num_nodes;
  int pick = -1;
  for (int i = 0; i < n; ++i) {
    const int code = s.headers[i].code;
    if (code == 0) continue;
    if (pick < 0 || (s.headers[pick].code == 1 && code != 1)) pick = i;  // Invalid wins over fallback.
  }
  if (pick >= 0) {
    *failed_rank = s.headers[pick].failed_rank;
    return common::FromApiStatus(s.headers[pick].code, s.headers[pick].text);
  }
  for (int i = 1; i < n; ++i) {
    if (s.headers[i].signature == s.headers[0].signature) continue;
    std::string detail;
    for (int j = 0; j < n; ++j) {
      absl::StrAppend(&detail, j == 0 ? "" : ", ", "node ", j);
      if (j < int(o_.node_ranks.size()))
        absl::StrAppend(&detail, " (ranks ", absl::StrJoin(o_.node_ranks[j], ","), ")");
      absl::StrAppend(&detail, " asked for ", s.headers[j].text);
    }
    return absl::InvalidArgumentError(absl::StrCat("allgather #", s.seq, ": nodes disagree: ", detail));
  }
  return absl::OkStatus();
}

void RingState::Fail(const absl::Status& st, Effects* fx) {
  if (failing_ || aborted_) return;
  failing_ = true;
  fx->fail = true;
  fx->fail_status = st;
}

void RingState::OnAbortFrame(Side from, const RingFrameV1& f, Effects* fx) {
  if (aborted_ || pending_ || failing_) return;  // The first failure heard wins.
  pending_ = true;
  pending_why_ = absl::AbortedError(f.text);
  spare_ = f.seq;
  abort_origin_ = f.origin;
  abort_from_ = from;
  if (f.failed_rank >= 0 && f.failed_rank < o_.num_nodes) {
    // A node died (or its links did; it may be this one): frames that had
    // to pass through it may never come, so nothing is spared; fail now.
    dead_node_ = f.failed_rank;
    Fail(pending_why_, fx);
    return;
  }
  if (SpareEnded()) FailSparing(fx);
}

void RingState::OnControl(int link, const RingFrameV1& f, Effects* fx) {
  next_heard_ns_[link] = clock_.NowNs();
  const bool bad = f.magic != kRingMagic || f.version != kRingVersion || f.origin < 0 || f.origin >= o_.num_nodes ||
                   (f.type != kFrameHeartbeat && f.type != kFrameAbort);
  if (bad) {
    if (!aborted_ && !failing_) dead_node_ = next_node();
    Fail(absl::AbortedError(
             absl::StrCat(NodeName(next_node()), " failed: it sent a malformed control frame on link ", link)),
         fx);
    return;
  }
  if (f.type == kFrameAbort) OnAbortFrame(Side::kNext, f, fx);
}

void RingState::LinkFailed(Side side, int link, const std::string& why, Effects* fx) {
  if (aborted_ || failing_) return;
  if (pending_) {
    // The neighbour that sent the abort frame is ending: its links close
    // once everything before the frame is out.
    if (side == Side::kNext && abort_from_ == Side::kNext) {
      return;  // It ended the spared ops: this node's frames of them are all out.
    }
    if (side == Side::kPrev && abort_from_ == Side::kPrev) {
      // Once all its links have closed, spared ops that did not end here never will.
      prev_closed_[link] = 1;
      if (std::count(prev_closed_.begin(), prev_closed_.end(), 1) < o_.links) return;
    }
    FailSparing(fx);
    return;
  }
  const int node = side == Side::kPrev ? prev_node() : next_node();
  dead_node_ = node;
  Fail(absl::AbortedError(absl::StrCat(NodeName(node), " failed: ring link ", link,
                                       side == Side::kPrev ? " from it" : " to it", " broke: ", why)),
       fx);
}

void RingState::Abort(const absl::Status& why, Effects* fx) {
  if (aborted_) return;
  aborted_ = true;
  abort_why_ = why;
  fx->drop_queued = true;
  // A job ending with no node blamed (its ranks left, an op timed out)
  // spares what ended here, as the abort frame tells the others to. Where
  // a node is blamed, an op not ended everywhere fails: it may lack data.
  if (dead_node_ < 0) CommitSpared(pending_ ? spare_ : last_ended_, fx);
  for (Slot& s : slots_) {
    if (!s.active) continue;
    s.active = false;
    if (s.busy != 0) {
      s.doomed = true;  // Ends when its frame being written or landed is done.
    } else {
      fx->ended.push_back(Ended{s.seq, why, -1});
    }
  }
  // Ops up to the spare ended at the origin: nodes further on may still
  // complete theirs from frames in flight (unless a node died).
  const int me = o_.my_node;
  const int origin = pending_ ? abort_origin_ : me;
  abort_frame_ = NewRingFrame(kFrameAbort, pending_ ? spare_ : last_ended_, origin);
  abort_frame_.failed_rank = dead_node_;
  SetFrameText(&abort_frame_, origin != me || dead_node_ >= 0 ? std::string(why.message())
                                                              : absl::StrCat(NodeName(me), ": ", why.message()));
  // Both ways round the ring, except back where it came from or to its
  // origin. (Also towards a node blamed: only one of its links may be dead.)
  fx->send_abort_next = next_node() != origin && !(pending_ && abort_from_ == Side::kNext);
  fx->send_abort_prev = prev_node() != origin && !(pending_ && abort_from_ == Side::kPrev);
}

void RingState::Tick(Effects* fx) {
  if (aborted_ || o_.heartbeat_interval <= absl::ZeroDuration()) return;
  const uint64_t now = clock_.NowNs();
  const uint64_t interval = uint64_t(absl::ToInt64Nanoseconds(o_.heartbeat_interval));
  for (int k = 0; k < o_.links; ++k) {
    if (prev_beat_ns_[k] == 0 || now - prev_beat_ns_[k] >= interval) {
      fx->heartbeats.push_back(k);
      prev_beat_ns_[k] = now;
    }
  }
  if (o_.peer_timeout <= absl::ZeroDuration() || failing_ || pending_) return;
  const uint64_t timeout = uint64_t(absl::ToInt64Nanoseconds(o_.peer_timeout));
  for (int k = 0; k < o_.links; ++k) {
    if (now - next_heard_ns_[k] <= timeout) continue;
    dead_node_ = next_node();
    Fail(absl::AbortedError(absl::StrCat(NodeName(next_node()), " failed: nothing heard on ring link ", k, " for ",
                                         absl::FormatDuration(absl::Nanoseconds(int64_t(now - next_heard_ns_[k]))),
                                         " (--peer_timeout_ms=", absl::ToInt64Milliseconds(o_.peer_timeout),
                                         "): its host is down or the network to it is cut")),
         fx);
    return;
  }
}

uint64_t RingState::NextTickNs() const {
  if (aborted_ || o_.heartbeat_interval <= absl::ZeroDuration()) return 0;
  const uint64_t interval = uint64_t(absl::ToInt64Nanoseconds(o_.heartbeat_interval));
  uint64_t due = UINT64_MAX;
  for (int k = 0; k < o_.links; ++k) due = std::min(due, prev_beat_ns_[k] + interval);
  if (o_.peer_timeout > absl::ZeroDuration() && !failing_ && !pending_) {
    const uint64_t timeout = uint64_t(absl::ToInt64Nanoseconds(o_.peer_timeout));
    for (int k = 0; k < o_.links; ++k) due = std::min(due, next_heard_ns_[k] + timeout + 1);
  }
  return due;
}

RingFrameV1 RingState::HeartbeatFrame() const { return NewRingFrame(kFrameHeartbeat, last_ended_, o_.my_node); }

std::string RingState::Pending(uint32_t seq) const {
  const Slot& s = slot(seq);
  if (!s.active || s.seq != seq) return "";
  std::vector<std::string> what;
  if (!s.released) what.push_back(absl::StrCat("allgather #", seq - 1, " to end first"));
  for (int i = 0; i < o_.num_nodes; ++i) {
    if (!s.have[i]) what.push_back(NodeName(i));
  }
  if (s.have_count == o_.num_nodes && s.chunks_got != s.chunks_expected) {
    what.push_back(absl::StrCat("chunks from ", NodeName(prev_node()), ": ", s.chunks_got, " of ", s.chunks_expected,
                                " received"));
  }
  if (s.local_ended) {
    for (int i = 0; i < o_.num_nodes; ++i) {
      if (i != o_.my_node && !s.ended_from[i]) what.push_back(absl::StrCat("the end of it on ", NodeName(i)));
    }
  }
  if (s.sends_pending != 0) {
    what.push_back(absl::StrCat(s.sends_pending, " frame(s) to ", NodeName(next_node())));
  }
  return absl::StrJoin(what, ", ");
}

}  // namespace dmagather::server::cluster

// SimRing: several nodes' RingStates joined by an in-memory transport,
// driven by one thread, step by step, on a FakeClock. Test-only.
//
// It plays what Ring's threads do - per link a send queue and sender, a
// receiver (forward direction) and a control reader (backward direction),
// a ticker, the Job's "first failure wins, then abort" - and models each
// link as a TCP connection with two directions that can be:
//   - delayed (forward frames held until released),
//   - closed by a dying daemon (its side's writes end in FIN after what it
//     already wrote; writes to it fail, and a connection it had unread data
//     on is reset at once),
//   - reset (every read and write on it fails at once),
//   - stalled (nothing moves either way, nothing fails: a host that lost
//     power, a cable cut without FIN).
// Every op ends at most once per node (checked); what each node's job
// ended with is kept for the test's verdict.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/cluster/ring_state.h"
#include "tests/fakes/fake_clock.h"

namespace dmagather::server::cluster::testing {

struct SimConn {                          // Link k from node a to node a+1.
  std::deque<RingFrameV1> fwd, bwd;       // Written, not yet read.
  bool fwd_fin = false, bwd_fin = false;  // The writer closed that direction: EOF after the frames in it.
  bool a_gone = false, b_gone = false;    // That end closed: writes to it fail (RST).
  bool reset = false;
  bool stalled = false;
  bool held = false;  // Forward frames are held (delay).
};

struct SimNode {
  std::unique_ptr<RingState> st;
  bool dead = false, silent = false;
  std::vector<std::deque<RingFrameV1>> sendq;  // Per link, to the next node.
  std::vector<char> send_abort, recv_done, ctrl_done;
  bool abort_prev = false;
  uint64_t aborted_at = 0;
  bool shut = false;
  std::map<uint32_t, std::vector<std::pair<int, RingFrameV1>>> own;  // By seq: (link, frame), header first.
  // The job.
  bool failed = false;
  absl::Status failure;
  bool has_spare = false;
  uint32_t spare = 0;
  std::map<uint32_t, absl::Status> results;  // Ops that ended, with their ring verdict.
  std::vector<uint32_t> started;
};

class SimRing {
 public:
  SimRing(int nodes, int links, common::testing::FakeClock& clock, absl::Duration peer_timeout = absl::Seconds(5),
          absl::Duration heartbeat = absl::Seconds(1))
      : n_(nodes), links_(links), clock_(clock), nodes_(nodes), conns_(nodes * links) {
    for (int i = 0; i < nodes; ++i) {
      RingStateOptions o;
      o.num_nodes = nodes;
      o.my_node = i;
      o.links = links;
      o.slots = 16;
      o.chunk_bytes = 1 << 20;
      o.heartbeat_interval = heartbeat;
      o.peer_timeout = peer_timeout;
      for (int j = 0; j < nodes; ++j) {
        o.node_names.push_back(absl::StrCat("host", j, " 10.0.0.", j + 1, ":7411"));
        o.node_ranks.push_back({j});
      }
      SimNode& s = nodes_[i];
      s.st = std::make_unique<RingState>(o, clock_);
      s.sendq.resize(links);
      s.send_abort.assign(links, 0);
      s.recv_done.assign(links, 0);
      s.ctrl_done.assign(links, 0);
    }
  }

  int size() const { return n_; }
  SimNode& node(int i) { return nodes_[i]; }
  SimConn& conn(int from, int k) { return conns_[from * links_ + k]; }
  int next(int i) const { return (i + 1) % n_; }
  int prev(int i) const { return (i + n_ - 1) % n_; }

  // Op `seq` starts on `node` with `chunks` chunks of its own (code: its
  // local verdict, 0 = OK).
  void StartOp(int node, uint32_t seq, int chunks, int32_t code = 0) {
    SimNode& s = nodes_[node];
    RingFrameV1 h = NewRingFrame(kFrameHeader, seq, node);
    h.code = code;
    h.signature = 42;
    h.chunks = code == 0 ? uint64_t(chunks) : 0;
    if (code != 0) SetFrameText(&h, absl::StrCat("rank ", node, " refused"));
    auto& own = s.own[seq];
    own = {{0, h}};
    for (uint64_t c = 0; c < h.chunks; ++c) {
      RingFrameV1 d = NewRingFrame(kFrameData, seq, node);
      d.rank = node;
      d.offset = c * 16;
      d.len = 16;
      own.emplace_back(int((c + uint64_t(node)) % uint64_t(links_)), d);
    }
    s.started.push_back(seq);
    RingState::Effects fx;
    s.st->Start(seq, h, h.chunks, &fx);
    Apply(node, fx);
  }
  void StartAll(uint32_t seq, int chunks) {
    for (int i = 0; i < n_; ++i) {
      if (!nodes_[i].dead && !nodes_[i].silent) StartOp(i, seq, chunks);
    }
  }

  // One round: every actor of every live node gets one turn. Returns
  // whether anything happened.
  bool Round() {
    bool any = false;
    for (int i = 0; i < n_; ++i) {
      SimNode& s = nodes_[i];
      if (s.dead || s.silent) continue;
      RingState::Effects fx;
      s.st->Tick(&fx);
      any |= !fx.heartbeats.empty() || fx.fail;
      Apply(i, fx);
      for (int k = 0; k < links_; ++k) {
        any |= SendTurn(i, k);
        any |= RecvTurn(i, k);
        any |= ControlTurn(i, k);
      }
      any |= BackTurn(i);
    }
    return any;
  }
  // Rounds until nothing moves (bounded).
  int Pump(int max_rounds = 100000) {
    int r = 0;
    while (r < max_rounds && Round()) ++r;
    EXPECT_LT(r, max_rounds) << "the simulated ring never settled";
    return r;
  }
  // Moves the clock in `step`s up to `total`, pumping after each.
  void AdvanceAndPump(absl::Duration total, absl::Duration step) {
    for (absl::Duration t = absl::ZeroDuration(); t < total; t += step) {
      clock_.Advance(step);
      Pump();
    }
  }

  // The daemon of `node` is killed: the kernel closes its sockets.
  void Kill(int node) {
    nodes_[node].dead = true;
    for (int k = 0; k < links_; ++k) {
      SimConn& out = conn(node, k);  // node -> next: it wrote fwd, read bwd.
      out.fwd_fin = true;
      out.a_gone = true;
      if (!out.bwd.empty()) out.reset = true;  // Unread data at close: RST.
      SimConn& in = conn(prev(node), k);       // prev -> node: it read fwd, wrote bwd.
      in.bwd_fin = true;
      in.b_gone = true;
      if (!in.fwd.empty()) in.reset = true;
    }
  }
  // `node`'s host loses power: nothing more to or from it, nothing fails.
  void PowerOff(int node) {
    nodes_[node].silent = true;
    for (int k = 0; k < links_; ++k) {
      conn(node, k).stalled = true;
      conn(prev(node), k).stalled = true;
    }
  }

  // --- The job (what Job::Fail / FailAfter do) ---
  void FailJob(int i, const absl::Status& st, bool after, uint32_t spare) {
    SimNode& s = nodes_[i];
    if (s.failed) return;
    s.failed = true;
    s.failure = st;
    s.has_spare = after;
    s.spare = spare;
    RingState::Effects fx;
    s.st->Abort(st, &fx);
    if (s.st->aborted() && s.aborted_at == 0) s.aborted_at = clock_.NowNs();
    Apply(i, fx);
  }

 private:
  void Apply(int i, RingState::Effects& fx) {
    SimNode& s = nodes_[i];
    for (uint32_t seq : fx.release) {
      for (const auto& [link, f] : s.own[seq]) s.sendq[link].push_back(f);
    }
    for (auto& [link, f] : fx.forward) s.sendq[link].push_back(f);
    if (fx.drop_queued) {
      for (auto& q : s.sendq) q.clear();
    }
    for (RingState::Ended& e : fx.ended) {
      EXPECT_EQ(s.results.count(e.seq), 0u) << "node " << i << ": op " << e.seq << " ended twice";
      s.results[e.seq] = e.status;
    }
    if (fx.send_abort_next) std::fill(s.send_abort.begin(), s.send_abort.end(), 1);
    if (fx.send_abort_prev) s.abort_prev = true;
    for (int k : fx.heartbeats) {
      SimConn& c = conn(prev(i), k);
      if (!c.a_gone && !c.reset) c.bwd.push_back(s.st->HeartbeatFrame());
    }
    if (fx.fail) FailJob(i, fx.fail_status, fx.fail_after, fx.fail_spare);
  }

  bool SendTurn(int i, int k) {
    SimNode& s = nodes_[i];
    SimConn& c = conn(i, k);
    if (s.st->aborted()) {
      if (!s.send_abort[k]) return false;
      s.send_abort[k] = 0;
      if (!c.b_gone && !c.reset) c.fwd.push_back(s.st->abort_frame());
      return true;
    }
    if (s.sendq[k].empty()) return false;
    RingFrameV1 f = s.sendq[k].front();
    s.sendq[k].pop_front();
    s.st->SendBegin(f.seq);
    const bool ok = !c.b_gone && !c.reset;
    if (ok) {
      c.fwd.push_back(f);
    } else {
      c.reset = true;  // Data to a closed socket: RST.
    }
    RingState::Effects fx;
    s.st->SendDone(f.seq, ok, &fx);
    if (!ok) s.st->LinkFailed(RingState::Side::kNext, k, "send: Connection reset by peer", &fx);
    Apply(i, fx);
    return true;
  }

  bool RecvTurn(int i, int k) {
    SimNode& s = nodes_[i];
    SimConn& c = conn(prev(i), k);
    if (s.recv_done[k] || c.stalled) return false;
    RingState::Effects fx;
    if (c.reset || (c.fwd.empty() && c.fwd_fin)) {
      s.recv_done[k] = 1;
      s.st->LinkFailed(RingState::Side::kPrev, k, c.reset ? "recv: Connection reset by peer" : "closed by the peer",
                       &fx);
      Apply(i, fx);
      return true;
    }
    if (c.held || c.fwd.empty()) return false;
    const RingFrameV1 f = c.fwd.front();
    const RingState::Frame what = s.st->OnFrame(k, f, &fx);
    if (what == RingState::Frame::kWait) return false;  // Parked: its op has not started here.
    c.fwd.pop_front();
    if (what == RingState::Frame::kChunk) s.st->ChunkDone(k, f, /*landed=*/true, &fx);
    if (what == RingState::Frame::kStop || what == RingState::Frame::kMalformed) s.recv_done[k] = 1;
    Apply(i, fx);
    return true;
  }

  bool ControlTurn(int i, int k) {
    SimNode& s = nodes_[i];
    SimConn& c = conn(i, k);
    if (s.ctrl_done[k] || c.stalled) return false;
    RingState::Effects fx;
    if (c.reset || (c.bwd.empty() && c.bwd_fin)) {
      s.ctrl_done[k] = 1;
      s.st->LinkFailed(RingState::Side::kNext, k, c.reset ? "recv: Connection reset by peer" : "closed by the peer",
                       &fx);
      Apply(i, fx);
      return true;
    }
    if (c.bwd.empty()) return false;
    const RingFrameV1 f = c.bwd.front();
    c.bwd.pop_front();
    s.st->OnControl(k, f, &fx);
    Apply(i, fx);
    return true;
  }

  // The ticker: abort frames back; one second after an abort every
  // connection is shut (what Ring's abort thread does).
  bool BackTurn(int i) {
    SimNode& s = nodes_[i];
    bool any = false;
    if (s.abort_prev) {
      s.abort_prev = false;
      for (int k = 0; k < links_; ++k) {
        SimConn& c = conn(prev(i), k);
        if (!c.a_gone && !c.reset) c.bwd.push_back(s.st->abort_frame());
      }
      any = true;
    }
    if (s.st->aborted() && !s.shut && clock_.NowNs() >= s.aborted_at + 1'000'000'000ull) {
      s.shut = true;
      for (int k = 0; k < links_; ++k) {
        conn(i, k).fwd_fin = conn(i, k).a_gone = true;
        conn(prev(i), k).bwd_fin = conn(prev(i), k).b_gone = true;
      }
      any = true;
    }
    return any;
  }

  const int n_, links_;
  common::testing::FakeClock& clock_;
  std::vector<SimNode> nodes_;
  std::vector<SimConn> conns_;
};

}  // namespace dmagather::server::cluster::testing

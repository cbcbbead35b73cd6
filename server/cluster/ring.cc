// Ring: the threads (links, ticker), the state machine's effects, start,
// abort and close (ring.h). An op's data - own frames, landing, staging - is
// in ring_data.cc.
#include "server/cluster/ring.h"

#include <algorithm>
#include <cstring>

#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/api_names.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/status.h"
#include "glog/logging.h"

namespace dmagather::server::cluster {

using scheduler::Op;

RingStateOptions Ring::StateOptions(const scheduler::Topology& topo, int links, const RingOptions& o) {
  RingStateOptions so;
  so.num_nodes = topo.num_nodes();
  so.my_node = topo.my_node;
  so.links = links;
  so.slots = int(abi::kRingSlotsV1);
  so.node_names = topo.node_names;
  so.node_ranks = topo.node_ranks;
  so.chunk_bytes = o.chunk_bytes;
  so.heartbeat_interval = o.heartbeat_interval;
  so.peer_timeout = o.peer_timeout;
  return so;
}

Ring::Ring(scheduler::Job* job, std::shared_ptr<const scheduler::Topology> topology,
           std::vector<std::unique_ptr<transport::Connection>> to_next,
           std::vector<std::unique_ptr<transport::Connection>> from_prev, RingOptions options)
    : job_(job),
      topo_(std::move(topology)),
      options_(std::move(options)),
      staged_(options_.engine != nullptr && (options_.force_staging || !options_.engine->host_addressable())),
      next_(to_next.size()),
      send_queues_(to_next.size()),
      prev_(std::move(from_prev)),
      state_(StateOptions(*topo_, int(to_next.size()), options_), *options_.clock),
      data_(abi::kRingSlotsV1) {
  for (size_t i = 0; i < to_next.size(); ++i) next_[i].conn = std::move(to_next[i]);
}

Ring::~Ring() {
  Close();
  for (SlotData& d : data_) {
    if (d.staging != nullptr) options_.engine->FreeStaging(d.staging);
  }
  for (auto& [p, bytes] : spare_staging_) options_.engine->FreeStaging(p);
}

void Ring::Run() {
  for (size_t i = 0; i < next_.size(); ++i) {
    next_[i].thread = std::thread(&Ring::SendLoop, this, int(i));
    next_[i].control_thread = std::thread(&Ring::ControlLoop, this, int(i));
  }
  for (size_t i = 0; i < prev_.size(); ++i) recv_threads_.emplace_back(&Ring::RecvLoop, this, int(i));
  tick_thread_ = std::thread(&Ring::TickLoop, this);
}

bool Ring::AbortFramesPendingLocked() const {
  for (const SendQueue& q : send_queues_) {
    if (q.send_abort) return true;
  }
  return send_abort_prev_;
}

void Ring::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_.load()) return;
    if (!state_.aborted()) {
      // The job ended here: the neighbours hear it (nothing is delivered
      // into the job any more).
      RingState::Effects fx;
      state_.Abort(absl::CancelledError("the job ended"), &fx);
      fx.ended.clear();
      Outcome ignored;
      ApplyLocked(fx, &ignored);
    }
    stop_waits_.store(true, std::memory_order_release);
    for (Link& l : next_) l.cv.SignalAll();
    tick_cv_.SignalAll();
    // The abort frames go out first (briefly: a cut link cannot hold us).
    const common::Clock& clock = *options_.clock;
    const absl::Time deadline = clock.Now() + absl::Seconds(1);
    while (AbortFramesPendingLocked() && clock.Now() < deadline)
      close_cv_.WaitWithTimeout(&mu_, deadline - clock.Now());
    closed_.store(true);
  }
  close_cv_.SignalAll();
  tick_cv_.SignalAll();
  if (abort_thread_.joinable()) abort_thread_.join();
  for (Link& l : next_) {
    l.conn->Shutdown();
    l.cv.SignalAll();
  }
  for (auto& c : prev_) c->Shutdown();
  slot_cv_.SignalAll();
  for (Link& l : next_) {
    if (l.thread.joinable()) l.thread.join();
    if (l.control_thread.joinable()) l.control_thread.join();
  }
  for (auto& t : recv_threads_) t.join();
  recv_threads_.clear();
  if (tick_thread_.joinable()) tick_thread_.join();
}

void Ring::QueueLocked(int link, const Send& s) {
  std::deque<Send>& q = send_queues_[link].frames;
  q.push_back(s);
  q.back().link = link;
  next_[link].cv.Signal();
}

void Ring::ApplyLocked(RingState::Effects& fx, Outcome* out, const char* payload) {
  for (uint32_t seq : fx.release) {
    SlotData& d = data_[seq % data_.size()];
    for (const Send& own : d.own) QueueLocked(own.link, own);
    d.own.clear();
  }
  for (auto& [link, frame] : fx.forward)
    QueueLocked(link, Send{frame, frame.type == kFrameData ? payload : nullptr, link});
  if (fx.drop_queued) {
    // Frames not yet written belong to ops that now fail.
    for (SendQueue& q : send_queues_) q.frames.clear();
  }
  for (RingState::Ended& e : fx.ended) {
    SlotData& d = data_[e.seq % data_.size()];
    if (d.staging != nullptr) {  // Nothing of it is in flight any more: its staging serves the next op.
      spare_staging_.emplace_back(d.staging, d.staging_bytes);
      d.staging = nullptr;
      d.staging_bytes = 0;
    }
    ops_.fetch_add(1, std::memory_order_relaxed);
    busy_ns_.fetch_add(common::MonotonicNs() - d.started_ns, std::memory_order_relaxed);
    out->ended.push_back(Ended{d.op, std::move(e.status), e.failed_rank});
  }
  if (fx.fail) {
    out->fail = true;
    out->fail_status = fx.fail_status;
    out->fail_after = fx.fail_after;
    out->spare = fx.fail_spare;
    out->blamed = state_.dead_node() >= 0;
  }
  if (fx.send_abort_next) {
    for (size_t k = 0; k < next_.size(); ++k) {
      send_queues_[k].send_abort = true;
      next_[k].cv.SignalAll();
    }
  }
  if (fx.send_abort_prev) {
    send_abort_prev_ = true;
    tick_cv_.SignalAll();
  }
  if (!fx.release.empty() || !fx.ended.empty()) slot_cv_.SignalAll();
}

void Ring::Deliver(Outcome& out) {
  for (Ended& e : out.ended) e.op->PartDone(e.status, e.failed_rank);
  if (!out.fail || closed_.load()) return;
  LOG(WARNING) << "job '" << job_->key() << "': " << out.fail_status.message();
  if (out.fail_after) {
    job_->FailAfter(out.fail_status, out.spare);  // Our ops up to the spare have ended; the rest fail.
  } else if (out.blamed && job_->HandBack(out.fail_status)) {
    // A node lost with ranks that wait for their daemons: the job is handed
    // back instead, and the ring formed again (Job::HandBack).
    LOG(WARNING) << "job '" << job_->key() << "': handing the job back to its ranks, to form the ring again "
                 << "once the node is back (within the ranks' DMAGATHER_RECONNECT_S)";
  } else {
    job_->Fail(out.fail_status, -1);
  }
}

void Ring::OnLinkError(RingState::Side side, int link, const absl::Status& st) {
  if (closed_.load()) return;
  Outcome out;
  {
    absl::MutexLock lock(&mu_);
    RingState::Effects fx;
    state_.LinkFailed(side, link, std::string(st.message()), &fx);
    ApplyLocked(fx, &out);
  }
  Deliver(out);
}

void Ring::Start(Op* op, const absl::Status& local_verdict, int failed_rank) {
  Outcome out;
  {
    absl::MutexLock lock(&mu_);
    const uint32_t idx = op->seq % data_.size();
    SlotData& d = data_[idx];
    d.op = op;
    d.own.clear();
    d.item_bytes.clear();
    d.item_base.clear();
    d.started_ns = common::MonotonicNs();
    RingFrameV1 h = NewRingFrame(kFrameHeader, op->seq, topo_->my_node);
    absl::Status verdict = local_verdict;
    const std::vector<int>& local = topo_->local_ranks();
    if (verdict.ok()) {
      uint64_t total = 0;
      for (const scheduler::Item& it : op->parts[local[0]].items) {
        d.item_base.push_back(total);
        d.item_bytes.push_back(it.count * common::DtypeSize(it.dtype));
        total += d.item_bytes.back() * uint64_t(topo_->world_size);
      }
      if (staged_) {
        verdict = EnsureStagingLocked(d, op->seq, std::max<uint64_t>(total, 1));
        if (!verdict.ok()) failed_rank = local[0];
      }
    }
    h.code = common::ToApiStatus(verdict);
    h.failed_rank = failed_rank;
    if (verdict.ok()) {
      BuildOwnFrames(op, idx, &h);
    } else {
      SetFrameText(&h, std::string(verdict.message()));
    }
    d.own.insert(d.own.begin(), Send{h, nullptr, 0});
    RingState::Effects fx;
    state_.Start(op->seq, h, d.own.size() - 1, &fx);
    ApplyLocked(fx, &out);
  }
  Deliver(out);
}

void Ring::RecvLoop(int k) {
  std::vector<char> scratch;
  transport::Connection& conn = *prev_[k];
  for (;;) {
    RingFrameV1 f;
    absl::Status st = conn.Recv(&f, sizeof(f));
    if (!st.ok()) {
      OnLinkError(RingState::Side::kPrev, k, st);
      return;
    }
    f.text[sizeof(f.text) - 1] = '\0';
    frames_received_.fetch_add(1, std::memory_order_relaxed);
    Outcome out;
    RingState::Frame what;
    {
      absl::MutexLock lock(&mu_);
      RingState::Effects fx;
      what = state_.OnFrame(k, f, &fx);
      while (what == RingState::Frame::kWait) {
        // Its op has not started here: its ranks will submit it.
        slot_cv_.Wait(&mu_);
        what = state_.OnFrame(k, f, &fx);
      }
      ApplyLocked(fx, &out);
    }
    Deliver(out);
    if (what == RingState::Frame::kChunk) {
      if (!LandChunk(k, f, &scratch)) return;
    } else if (what != RingState::Frame::kDone) {
      return;
    }
  }
}

void Ring::SendLoop(int k) {
  Link& link = next_[k];
  for (;;) {
    Send item;
    {
      absl::MutexLock lock(&mu_);
      while (!state_.aborted() && !closed_.load() && send_queues_[k].frames.empty()) link.cv.Wait(&mu_);
      if (state_.aborted() || closed_.load()) {
        if (send_queues_[k].send_abort) {
          // Best effort: the next node learns why (after everything sent before).
          const RingFrameV1 abort = state_.abort_frame();
          mu_.Unlock();
          (void)link.conn->Send(&abort, sizeof(abort), nullptr, 0);
          mu_.Lock();
          send_queues_[k].send_abort = false;
          close_cv_.SignalAll();
        }
        return;
      }
      std::deque<Send>& q = send_queues_[k].frames;
      item = q.front();
      q.pop_front();
      state_.SendBegin(item.frame.seq);  // Its payload is read outside mu_.
    }
    const uint64_t len = item.frame.type == kFrameData ? item.frame.len : 0;
    absl::Status staged = absl::OkStatus();
    if (item.stage_src != nullptr) {
      // The rank's input is written once it has reached this op (its ready flag).
      if (!item.ready_known) staged = options_.engine->WaitRankReady(item.stage_rank, item.frame.seq, stop_waits_);
      if (staged.ok()) {
        staged = options_.engine->StageOut(const_cast<char*>(item.payload), item.stage_src, len, item.stage_rank);
      }
    }
    absl::Status st = staged.ok() ? link.conn->Send(&item.frame, sizeof(item.frame), item.payload, len) : staged;
    Outcome out;
    {
      absl::MutexLock lock(&mu_);
      RingState::Effects fx;
      state_.SendDone(item.frame.seq, st.ok(), &fx);
      ApplyLocked(fx, &out);
    }
    Deliver(out);
    if (!staged.ok()) {
      StagingFailed(staged);
      return;
    }
    if (!st.ok()) {
      OnLinkError(RingState::Side::kNext, k, st);
      return;
    }
    bytes_sent_.fetch_add(len, std::memory_order_relaxed);
    frames_sent_.fetch_add(1, std::memory_order_relaxed);
  }
}

void Ring::ControlLoop(int k) {
  transport::Connection& conn = *next_[k].conn;
  for (;;) {
    RingFrameV1 f;
    absl::Status st = conn.Recv(&f, sizeof(f));
    if (!st.ok()) {
      // The next node closed its end (its daemon died or it ended), or the
      // connection was shut here.
      OnLinkError(RingState::Side::kNext, k, st);
      return;
    }
    f.text[sizeof(f.text) - 1] = '\0';
    Outcome out;
    {
      absl::MutexLock lock(&mu_);
      RingState::Effects fx;
      state_.OnControl(k, f, &fx);
      ApplyLocked(fx, &out);
    }
    Deliver(out);
  }
}

void Ring::TickLoop() {
  absl::MutexLock lock(&mu_);
  while (!closed_.load()) {
    RingState::Effects fx;
    state_.Tick(&fx);
    Outcome out;
    ApplyLocked(fx, &out);
    const bool abort_back = send_abort_prev_;
    const RingFrameV1 frame = abort_back ? state_.abort_frame() : state_.HeartbeatFrame();
    const std::vector<int> links = abort_back ? std::vector<int>() : fx.heartbeats;
    mu_.Unlock();
    // This thread alone writes on the previous node's links (backwards).
    for (size_t k = 0; k < prev_.size(); ++k) {
      if (abort_back) (void)prev_[k]->Send(&frame, sizeof(frame), nullptr, 0);
    }
    for (int k : links) {
      absl::Status st = prev_[k]->Send(&frame, sizeof(frame), nullptr, 0);
      if (!st.ok()) OnLinkError(RingState::Side::kPrev, k, st);
    }
    Deliver(out);
    mu_.Lock();
    if (abort_back) {
      send_abort_prev_ = false;
      close_cv_.SignalAll();
    }
    const uint64_t due = state_.NextTickNs(), now = state_.NowNs();
    const uint64_t wait_ns = due == 0 ? 100'000'000 : std::min<uint64_t>(due > now ? due - now : 0, 100'000'000);
    const common::Clock& clock = *options_.clock;
    const absl::Time deadline = clock.Now() + absl::Nanoseconds(std::max<uint64_t>(wait_ns, 1'000'000));
    while (!closed_.load() && !send_abort_prev_ && clock.Now() < deadline) {
      tick_cv_.WaitWithTimeout(&mu_, deadline - clock.Now());
    }
  }
}

void Ring::Abort(const absl::Status& why) {
  Outcome out;
  {
    absl::MutexLock lock(&mu_);
    if (state_.aborted()) return;
    RingState::Effects fx;
    state_.Abort(why, &fx);
    stop_waits_.store(true, std::memory_order_release);
    ApplyLocked(fx, &out);
    for (Link& l : next_) l.cv.SignalAll();
    // A cut link can hold a Send or a Recv until the transport gives up:
    // after a moment for the abort frames, every connection is shut.
    abort_thread_ = std::thread([this] {
      {
        absl::MutexLock lock(&mu_);
        const common::Clock& clock = *options_.clock;
        const absl::Time deadline = clock.Now() + absl::Seconds(1);
        while (!closed_.load() && clock.Now() < deadline) close_cv_.WaitWithTimeout(&mu_, deadline - clock.Now());
      }
      for (Link& l : next_) l.conn->Shutdown();
      for (auto& c : prev_) c->Shutdown();
    });
  }
  slot_cv_.SignalAll();
  Deliver(out);
}

std::string Ring::Pending(uint32_t seq) const {
  absl::MutexLock lock(&mu_);
  return state_.Pending(seq);
}

scheduler::RemoteStats Ring::stats() const {
  scheduler::RemoteStats st;
  st.transport = options_.transport;
  st.transport_reason = options_.transport_reason;
  st.links = static_cast<int>(next_.size());
  st.next = topo_->node_names[next_node()];
  st.prev = topo_->node_names[prev_node()];
  st.bytes_sent = bytes_sent_.load();
  st.bytes_received = bytes_received_.load();
  st.frames_sent = frames_sent_.load();
  st.frames_received = frames_received_.load();
  st.ops = ops_.load();
  st.busy_ns = busy_ns_.load();
  st.chunk_latency = chunk_ns_.Summary();
  {
    absl::MutexLock lock(&mu_);
    st.transit_bytes = staging_total_;
  }
  return st;
}

}  // namespace dmagather::server::cluster

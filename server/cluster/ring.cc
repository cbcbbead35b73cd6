#include "server/cluster/ring.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "abi/ring_v1.h"
#include "common/api_names.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/status.h"
#include "glog/logging.h"

namespace dmagather::server::cluster {
namespace {

using scheduler::Op;
using scheduler::OpKind;

uint64_t Mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;  // FNV-1a: the same on every daemon (unlike a seeded hash).
  }
  return h;
}

void SetText(RingFrameV1* f, absl::string_view t) {
  const size_t n = std::min(t.size(), sizeof(f->text) - 1);
  memcpy(f->text, t.data(), n);
  f->text[n] = '\0';
}

// Smallest chunk a shard is cut into to spread it over the links.
constexpr uint64_t kMinChunk = 64 << 10;

RingFrameV1 NewFrame(uint16_t type, uint32_t seq, int origin) {
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

}  // namespace

Ring::Ring(scheduler::Job* job, std::shared_ptr<const scheduler::Topology> topology,
           std::vector<std::unique_ptr<transport::Connection>> to_next,
           std::vector<std::unique_ptr<transport::Connection>> from_prev, RingOptions options)
    : job_(job),
      topo_(std::move(topology)),
      options_(std::move(options)),
      staged_(options_.engine != nullptr && (options_.force_staging || !options_.engine->host_addressable())),
      next_(to_next.size()),
      prev_(std::move(from_prev)),
      slots_(abi::kRingSlotsV1) {
  for (size_t i = 0; i < to_next.size(); ++i) next_[i].conn = std::move(to_next[i]);
  for (Slot& s : slots_) {
    s.headers.resize(topo_->num_nodes());
    s.have.resize(topo_->num_nodes());
  }
}

Ring::~Ring() {
  Close();
  for (Slot& s : slots_) {
    if (s.staging != nullptr) options_.engine->FreeStaging(s.staging);
  }
  for (auto& [p, bytes] : spare_staging_) options_.engine->FreeStaging(p);
}

absl::Status Ring::EnsureStagingLocked(Slot& s, uint64_t bytes) {
  if (s.staging_bytes >= bytes) return absl::OkStatus();
  // Buffers are never freed while the job runs (freeing pinned memory can
  // wait for the device, whose streams may wait for ranks that wait for
  // this ring): a slot's too-small buffer goes to the spare list, and a
  // spare one that fits is reused before anything is allocated.
  if (s.staging != nullptr) spare_staging_.emplace_back(s.staging, s.staging_bytes);
  s.staging = nullptr;
  s.staging_bytes = 0;
  size_t best = spare_staging_.size();
  for (size_t i = 0; i < spare_staging_.size(); ++i) {
    if (spare_staging_[i].second >= bytes &&
        (best == spare_staging_.size() || spare_staging_[i].second < spare_staging_[best].second)) {
      best = i;
    }
  }
  if (best != spare_staging_.size()) {
    s.staging = spare_staging_[best].first;
    s.staging_bytes = spare_staging_[best].second;
    spare_staging_.erase(spare_staging_.begin() + long(best));
    return absl::OkStatus();
  }
  if (staging_total_ + bytes > options_.transit_bytes) {
    return common::FallbackError(absl::StrCat(
        "allgather #", s.seq, " needs ", bytes >> 20, " MiB of ring transit on this node, over the ",
        (options_.transit_bytes - std::min(options_.transit_bytes, staging_total_)) >> 20,
        " MiB left of dmagatherd --ring_transit_mib"));
  }
  DMAG_ASSIGN_OR_RETURN(void* p, options_.engine->AllocStaging(bytes));
  s.staging = static_cast<char*>(p);
  s.staging_bytes = bytes;
  staging_total_ += bytes;
  return absl::OkStatus();
}

void Ring::Run() {
  for (size_t i = 0; i < next_.size(); ++i) next_[i].thread = std::thread(&Ring::SendLoop, this, int(i));
  for (size_t i = 0; i < prev_.size(); ++i) recv_threads_.emplace_back(&Ring::RecvLoop, this, int(i));
}

void Ring::Close() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_.load()) return;
    if (!aborted_) abort_why_ = absl::CancelledError("the job ended");
    aborted_ = true;
    stop_waits_.store(true, std::memory_order_release);
    for (Link& l : next_) l.cv.notify_all();
    // The abort frames go out first (briefly: a cut link cannot hold us).
    close_cv_.wait_for(lock, std::chrono::seconds(1), [this] {
      for (const Link& l : next_) {
        if (l.send_abort) return false;
      }
      return true;
    });
    closed_.store(true);
  }
  close_cv_.notify_all();
  if (abort_thread_.joinable()) abort_thread_.join();
  for (Link& l : next_) {
    l.conn->Shutdown();
    l.cv.notify_all();
  }
  for (auto& c : prev_) c->Shutdown();
  slot_cv_.notify_all();
  for (Link& l : next_) {
    if (l.thread.joinable()) l.thread.join();
  }
  for (auto& t : recv_threads_) t.join();
  recv_threads_.clear();
}

void Ring::QueueLocked(int link, const Send& s) {
  ++slots_[s.slot].sends_pending;
  Link& l = next_[link];
  l.queue.push_back(s);
  l.queue.back().link = link;
  l.cv.notify_one();
}

void Ring::ReleaseLocked(Slot& s) {
  for (const Send& own : s.own) QueueLocked(own.link, own);
  s.own.clear();
  s.released = true;
}

void Ring::Start(Op* op, const absl::Status& local_verdict, int failed_rank) {
  const uint32_t idx = op->seq % slots_.size();
  const int me = topo_->my_node;
  const int links = static_cast<int>(next_.size());
  std::vector<Ended> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = slots_[idx];
    s.seq = op->seq;
    s.op = op;
    std::fill(s.have.begin(), s.have.end(), 0);
    s.have_count = 1;
    s.chunks_expected = s.chunks_got = 0;
    s.sends_pending = 0;
    s.own.clear();
    s.item_bytes.clear();
    s.item_base.clear();
    s.released = false;
    s.started_ns = common::MonotonicNs();

    RingFrameV1 h = NewFrame(kFrameHeader, op->seq, me);
    absl::Status verdict = local_verdict;
    const std::vector<int>& local = topo_->local_ranks();
    if (verdict.ok()) {
      const scheduler::RankPart& ref = op->parts[local[0]];
      uint64_t total = 0;
      for (const scheduler::Item& it : ref.items) {
        s.item_base.push_back(total);
        s.item_bytes.push_back(it.count * common::DtypeSize(it.dtype));
        total += s.item_bytes.back() * uint64_t(topo_->world_size);
      }
      if (staged_) {
        verdict = EnsureStagingLocked(s, std::max<uint64_t>(total, 1));
        if (!verdict.ok()) failed_rank = local[0];
      }
    }
    s.local_ok = verdict.ok();
    h.code = common::ToApiStatus(verdict);
    h.failed_rank = failed_rank;
    if (s.local_ok) {
      // The node's shape (every local rank agreed on it) and its block.
      const scheduler::RankPart& ref = op->parts[local[0]];
      uint64_t sig = Mix(1469598103934665603ull, ref.items.size());
      for (const scheduler::Item& it : ref.items) {
        sig = Mix(Mix(Mix(sig, uint64_t(it.kind)), it.count), it.dtype);
      }
      h.signature = sig;
      const scheduler::Item& first = ref.items[0];
      SetText(&h, absl::StrCat(first.kind == OpKind::kAllGatherList ? "allgather_list" : "allgather",
                               " count=", first.count, " dtype=", common::DtypeName(first.dtype),
                               ref.items.size() > 1 ? absl::StrCat(" (+", ref.items.size() - 1, " items)") : ""));
      uint64_t c = 0;
      // Every link carries a share even of a small op: a shard is cut into
      // at least `links` chunks (down to kMinChunk), and each origin starts
      // on its own link, so forwarded blocks spread over the links too.
      for (size_t i = 0; i < ref.items.size(); ++i) {
        const uint64_t bytes = s.item_bytes[i];
        const uint64_t step = std::min<uint64_t>(
            options_.chunk_bytes, std::max<uint64_t>(kMinChunk, (bytes + links - 1) / uint64_t(links)));
        for (int r : local) {
          const char* src = op->parts[r].items[i].send;
          for (uint64_t off = 0; off < bytes; off += step, ++c) {
            RingFrameV1 d = NewFrame(kFrameData, op->seq, me);
            d.item = static_cast<uint32_t>(i);
            d.rank = r;
            d.offset = off;
            d.len = std::min<uint64_t>(step, bytes - off);
            const int link = int((c + uint64_t(me)) % uint64_t(links));
            if (staged_) {
              // Sent from staging, after its link thread copies it out of the rank's memory.
              s.own.push_back(Send{d, StagingDest(s, d), idx, link, src + off, op->ranks[r], op->ready_observed});
            } else {
              s.own.push_back(Send{d, src + off, idx, link});
            }
          }
        }
      }
      h.chunks = c;
    } else {
      SetText(&h, verdict.message());
    }
    s.headers[me] = h;
    s.have[me] = 1;
    s.own.insert(s.own.begin(), Send{h, nullptr, idx, 0});
    if (aborted_) {
      ended.push_back(Ended{op, abort_why_, -1});
    } else {
      s.active = true;
      if (!any_started_ || op->seq == last_ended_ + 1) ReleaseLocked(s);
      any_started_ = true;
    }
  }
  slot_cv_.notify_all();
  Deliver(ended);
}

bool Ring::Fits(const Slot& s, const RingFrameV1& f) const {
  if (f.item >= s.item_bytes.size()) return false;
  if (f.rank < 0 || f.rank >= topo_->world_size || topo_->node_of_rank[f.rank] != f.origin) return false;
  const uint64_t bytes = s.item_bytes[f.item];
  return f.len <= bytes && f.offset <= bytes - f.len;
}

char* Ring::StagingDest(const Slot& s, const RingFrameV1& f) const {
  return s.staging + s.item_base[f.item] + uint64_t(f.rank) * s.item_bytes[f.item] + f.offset;
}

char* Ring::Dest(const Slot& s, int l, const RingFrameV1& f) const {
  const uint64_t bytes = s.item_bytes[f.item];
  const scheduler::RankPart& p = s.op->parts[topo_->local_ranks()[l]];
  const scheduler::Item& it = p.items[f.item];
  char* base = it.kind == OpKind::kAllGatherList ? p.recv[it.recv_begin + f.rank]
                                                 : p.recv[it.recv_begin] + uint64_t(f.rank) * bytes;
  return base + f.offset;
}

void Ring::RecvLoop(int k) {
  const int n_nodes = topo_->num_nodes();
  const int me = topo_->my_node;
  const std::string from = absl::StrCat("node ", prev_node(), " (", topo_->node_names[prev_node()], ")");
  std::vector<char> scratch;
  transport::Connection& conn = *prev_[k];
  for (;;) {
    RingFrameV1 f;
    absl::Status st = conn.Recv(&f, sizeof(f));
    if (!st.ok()) {
      {
        // After an abort frame the origin is ending: its links close. The
        // ops it ended are complete here or time out; nothing to add.
        std::lock_guard<std::mutex> lock(mu_);
        if (pending_abort_) return;
      }
      LinkFailed(absl::StrCat("ring link ", k, " from ", from, " broke: ", st.message()));
      return;
    }
    f.text[sizeof(f.text) - 1] = '\0';
    const bool data = f.type == kFrameData;
    if (f.magic != kRingMagic || f.version != kRingVersion || f.origin < 0 || f.origin >= n_nodes ||
        f.origin == me || (data && f.len > options_.chunk_bytes) ||
        (f.type != kFrameHeader && !data && f.type != kFrameSkip && f.type != kFrameAbort)) {
      LinkFailed(absl::StrCat(from, " sent a malformed ring frame on link ", k));
      return;
    }
    frames_received_.fetch_add(1, std::memory_order_relaxed);
    if (f.type == kFrameAbort) {
      bool now = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!aborted_ && !pending_abort_) {
          pending_abort_ = true;
          pending_why_ = absl::AbortedError(f.text);
          spare_ = f.seq;
          abort_origin_ = f.origin;
        }
        now = pending_abort_ && SpareEndedLocked();
      }
      if (now && !closed_.load()) job_->FailAfter(pending_why_, f.seq);
      return;  // Nothing follows an abort frame on its link.
    }
    const uint32_t idx = f.seq % slots_.size();
    std::vector<Ended> ended;
    std::unique_lock<std::mutex> lock(mu_);
    slot_cv_.wait(lock, [&] { return aborted_ || (slots_[idx].active && slots_[idx].seq == f.seq); });
    if (aborted_) return;
    Slot& s = slots_[idx];
    const bool forward = next_node() != f.origin;
    if (f.type == kFrameHeader) {
      if (!s.have[f.origin]) {
        s.have[f.origin] = 1;
        ++s.have_count;
        s.headers[f.origin] = f;
        s.chunks_expected += f.chunks;
      }
      if (forward) QueueLocked(k, Send{f, nullptr, idx, k});
    } else {
      // Where the chunk lands: the first local output, or (staged) host staging.
      char* dst = data && s.local_ok && Fits(s, f) ? (staged_ ? StagingDest(s, f) : Dest(s, 0, f)) : nullptr;
      if (data) {
        // The slot cannot end while this chunk is uncounted (nor be failed
        // while busy): land it unlocked.
        ++s.busy;
        lock.unlock();
        const uint64_t t0 = common::MonotonicNs();
        if (dst != nullptr) {
          st = conn.Recv(dst, f.len);
        } else {
          scratch.resize(std::min<uint64_t>(f.len, 1 << 20));
          for (uint64_t left = f.len; left > 0 && st.ok();) {
            const uint64_t n = std::min<uint64_t>(left, scratch.size());
            st = conn.Recv(scratch.data(), n);
            left -= n;
          }
        }
        if (!st.ok()) {
          {
            std::lock_guard<std::mutex> relock(mu_);
            UnbusyLocked(s, &ended);
          }
          Deliver(ended);
          LinkFailed(absl::StrCat("ring link ", k, " from ", from, " broke: ", st.message()));
          return;
        }
        chunk_ns_.Record(common::MonotonicNs() - t0);
        bytes_received_.fetch_add(f.len, std::memory_order_relaxed);
        if (dst != nullptr) {
          const std::vector<int>& local = topo_->local_ranks();
          for (size_t l = staged_ ? 0 : 1; l < local.size(); ++l) {
            if (!staged_) {
              memcpy(Dest(s, int(l), f), dst, f.len);
              continue;
            }
            // The output may still be read by the rank's earlier work until it reaches this op.
            const engines::EngineRank* rank = s.op->ranks[local[l]];
            if (!s.op->ready_observed) st = options_.engine->WaitRankReady(rank, f.seq, stop_waits_);
            if (st.ok()) st = options_.engine->StageIn(Dest(s, int(l), f), dst, f.len, rank);
            if (!st.ok()) break;
          }
        }
        if (!st.ok()) {
          {
            std::lock_guard<std::mutex> relock(mu_);
            UnbusyLocked(s, &ended);
          }
          Deliver(ended);
          StagingFailed(st);
          return;
        }
        lock.lock();
        UnbusyLocked(s, &ended);
        if (aborted_) {
          lock.unlock();
          Deliver(ended);
          return;
        }
      }
      ++s.chunks_got;
      if (forward) {
        Send fw{f, dst, idx, k};
        if (dst == nullptr) {
          fw.frame.type = kFrameSkip;
          fw.frame.len = 0;
        }
        QueueLocked(k, fw);
      }
    }
    MaybeEndLocked(idx, &ended);
    lock.unlock();
    Deliver(ended);
  }
}

void Ring::SendLoop(int k) {
  Link& link = next_[k];
  const std::string to = absl::StrCat("node ", next_node(), " (", topo_->node_names[next_node()], ")");
  for (;;) {
    Send item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      link.cv.wait(lock, [&] { return aborted_ || !link.queue.empty(); });
      if (aborted_) {
        if (link.send_abort) {
          // Best effort: the next node learns why (after everything sent before).
          link.sending = true;
          lock.unlock();
          (void)link.conn->Send(&abort_frame_, sizeof(abort_frame_), nullptr, 0);
          lock.lock();
          link.sending = false;
          link.send_abort = false;
          close_cv_.notify_all();
        }
        return;
      }
      item = link.queue.front();
      link.queue.pop_front();
      ++slots_[item.slot].busy;  // Its payload is read outside mu_.
      link.sending = true;
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
    std::vector<Ended> ended;
    {
      std::lock_guard<std::mutex> lock(mu_);
      link.sending = false;
      Slot& s = slots_[item.slot];
      UnbusyLocked(s, &ended);
      if (st.ok() && !aborted_) {
        --s.sends_pending;
        MaybeEndLocked(item.slot, &ended);
      }
    }
    Deliver(ended);
    if (!staged.ok()) {
      StagingFailed(staged);
      return;
    }
    if (!st.ok()) {
      LinkFailed(absl::StrCat("ring link ", k, " to ", to, " failed: ", st.message()));
      return;
    }
    bytes_sent_.fetch_add(len, std::memory_order_relaxed);
    frames_sent_.fetch_add(1, std::memory_order_relaxed);
  }
}

void Ring::MaybeEndLocked(uint32_t index, std::vector<Ended>* ended) {
  Slot& s = slots_[index];
  if (!s.active || !s.released || s.have_count != topo_->num_nodes() || s.chunks_got != s.chunks_expected ||
      s.sends_pending != 0) {
    return;
  }
  int who = -1;
  absl::Status verdict = VerdictLocked(s, &who);
  s.active = false;
  if (s.staging != nullptr) {  // Every frame of it is out and in: its staging serves the next op.
    spare_staging_.emplace_back(s.staging, s.staging_bytes);
    s.staging = nullptr;
    s.staging_bytes = 0;
  }
  ops_.fetch_add(1, std::memory_order_relaxed);
  busy_ns_.fetch_add(common::MonotonicNs() - s.started_ns, std::memory_order_relaxed);
  ended->push_back(Ended{s.op, std::move(verdict), who});
  last_ended_ = s.seq;
  Slot& next = slots_[(s.seq + 1) % slots_.size()];
  if (next.active && next.seq == s.seq + 1 && !next.released) ReleaseLocked(next);
  if (pending_abort_ && !aborted_ && SpareEndedLocked()) {
    ended->push_back(Ended{nullptr, pending_why_, -1, spare_});
  }
}

void Ring::UnbusyLocked(Slot& s, std::vector<Ended>* ended) {
  if (--s.busy == 0 && s.doomed) {
    s.doomed = false;
    ended->push_back(Ended{s.op, abort_why_, -1});
  }
}

void Ring::Deliver(std::vector<Ended>& ended) {
  for (Ended& e : ended) {
    if (e.op != nullptr) {
      e.op->PartDone(e.status, e.failed_rank);
    } else if (!closed_.load()) {
      job_->FailAfter(e.status, e.spare);  // Our ops up to the spare have ended; the rest fail.
    }
  }
}

absl::Status Ring::VerdictLocked(const Slot& s, int* failed_rank) const {
  const int n = topo_->num_nodes();
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
      absl::StrAppend(&detail, j == 0 ? "" : ", ", "node ", j, " (ranks ", absl::StrJoin(topo_->node_ranks[j], ","),
                      ") asked for ", s.headers[j].text);
    }
    return absl::InvalidArgumentError(absl::StrCat("allgather #", s.seq, ": nodes disagree: ", detail));
  }
  return absl::OkStatus();
}

void Ring::Abort(const absl::Status& why) {
  std::vector<Ended> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_why_ = why;
    stop_waits_.store(true, std::memory_order_release);
    // Frames not yet written belong to ops that now fail: drop them. An op
    // with a frame being written or landed ends when that is done.
    for (Link& l : next_) l.queue.clear();
    for (Slot& s : slots_) {
      if (!s.active) continue;
      s.active = false;
      if (s.busy != 0) {
        s.doomed = true;
      } else {
        ended.push_back(Ended{s.op, why, -1});
      }
    }
    // Ops up to `spare` ended at the origin: the next nodes may still
    // complete theirs from frames in flight.
    const int origin = pending_abort_ ? abort_origin_ : topo_->my_node;
    abort_frame_ = NewFrame(kFrameAbort, pending_abort_ ? spare_ : last_ended_, origin);
    SetText(&abort_frame_, origin == topo_->my_node
                               ? absl::StrCat("node ", origin, " (", topo_->node_names[origin], "): ", why.message())
                               : std::string(why.message()));
    for (Link& l : next_) l.send_abort = next_node() != origin;
    // A cut link can hold a Send or a Recv until keepalive gives up: after
    // a moment for the abort frames, every connection is shut.
    abort_thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      close_cv_.wait_for(lock, std::chrono::seconds(1), [this] { return closed_.load(); });
      lock.unlock();
      for (Link& l : next_) l.conn->Shutdown();
      for (auto& c : prev_) c->Shutdown();
    });
  }
  for (Link& l : next_) l.cv.notify_all();
  slot_cv_.notify_all();
  Deliver(ended);
}

void Ring::LinkFailed(const std::string& why) {
  if (closed_.load()) return;
  bool pending;
  absl::Status st;
  uint32_t spare;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    // After an abort frame, the origin's reason is the one that counts.
    pending = pending_abort_;
    st = pending ? pending_why_ : absl::AbortedError(why);
    spare = spare_;
  }
  LOG(WARNING) << "job '" << job_->key() << "': " << why;
  if (pending) {
    job_->FailAfter(st, spare);
  } else {
    job_->Fail(st, -1);
  }
}

void Ring::StagingFailed(const absl::Status& st) {
  if (closed_.load() || absl::IsCancelled(st)) return;  // Cancelled: the ring is stopping anyway.
  LOG(ERROR) << "job '" << job_->key() << "': ring staging copy failed: " << st;
  job_->Fail(common::Annotate(st, "ring staging copy (host <-> rank memory) failed: "), -1);
}

std::string Ring::Pending(uint32_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Slot& s = slots_[seq % slots_.size()];
  if (!s.active || s.seq != seq) return "";
  std::vector<std::string> what;
  if (!s.released) what.push_back(absl::StrCat("allgather #", seq - 1, " to end first"));
  for (int i = 0; i < topo_->num_nodes(); ++i) {
    if (!s.have[i]) what.push_back(absl::StrCat("node ", i, " (", topo_->node_names[i], ")"));
  }
  if (s.have_count == topo_->num_nodes() && s.chunks_got != s.chunks_expected) {
    what.push_back(absl::StrCat("chunks from node ", prev_node(), " (", topo_->node_names[prev_node()], "): ",
                                s.chunks_got, " of ", s.chunks_expected, " received"));
  }
  if (s.sends_pending != 0) {
    what.push_back(absl::StrCat(s.sends_pending, " frame(s) to node ", next_node(), " (",
                                topo_->node_names[next_node()], ")"));
  }
  return absl::StrJoin(what, ", ");
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
    std::lock_guard<std::mutex> lock(mu_);
    st.transit_bytes = staging_total_;
  }
  return st;
}

}  // namespace dmagather::server::cluster

// Ring: the data of an op (ring.h) - its own frames cut into chunks over
// the links, where a received chunk lands in the local ranks' outputs, and
// the host staging of backends whose rank memory the daemon cannot address.
// The threads and the state machine's effects are in ring.cc.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/api_names.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/status.h"
#include "glog/logging.h"
#include "server/cluster/ring.h"

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

// Smallest chunk a shard is cut into to spread it over the links.
constexpr uint64_t kMinChunk = 64 << 10;

}  // namespace

absl::Status Ring::EnsureStagingLocked(SlotData& s, uint32_t seq, uint64_t bytes) {
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
    return common::FallbackError(
        absl::StrCat("allgather #", seq, " needs ", bytes >> 20, " MiB of ring transit on this node, over the ",
                     (options_.transit_bytes - std::min(options_.transit_bytes, staging_total_)) >> 20,
                     " MiB left of dmagatherd --ring_transit_mib"));
  }
  DMAG_ASSIGN_OR_RETURN(void* p, options_.engine->AllocStaging(bytes));
  s.staging = static_cast<char*>(p);
  s.staging_bytes = bytes;
  staging_total_ += bytes;
  return absl::OkStatus();
}

void Ring::BuildOwnFrames(Op* op, uint32_t idx, RingFrameV1* h) {
  SlotData& d = data_[idx];
  const int me = topo_->my_node;
  const int links = static_cast<int>(next_.size());
  const std::vector<int>& local = topo_->local_ranks();
  // The node's shape (every local rank agreed on it) and its block.
  const scheduler::RankPart& ref = op->parts[local[0]];
  uint64_t sig = Mix(1469598103934665603ull, ref.items.size());
  for (const scheduler::Item& it : ref.items) {
    sig = Mix(Mix(Mix(sig, uint64_t(it.kind)), it.count), it.dtype);
  }
  h->signature = sig;
  const scheduler::Item& first = ref.items[0];
  SetFrameText(h, absl::StrCat(first.kind == OpKind::kAllGatherList ? "allgather_list" : "allgather",
                               " count=", first.count, " dtype=", common::DtypeName(first.dtype),
                               ref.items.size() > 1 ? absl::StrCat(" (+", ref.items.size() - 1, " items)") : ""));
  uint64_t c = 0;
  // Every link carries a share even of a small op: a shard is cut into at
  // least `links` chunks (down to kMinChunk), and each origin starts on its
  // own link, so forwarded blocks spread over the links too.
  for (size_t i = 0; i < ref.items.size(); ++i) {
    const uint64_t bytes = d.item_bytes[i];
    const uint64_t step =
        std::min<uint64_t>(options_.chunk_bytes, std::max<uint64_t>(kMinChunk, (bytes + links - 1) / uint64_t(links)));
    for (int r : local) {
      const char* src = op->parts[r].items[i].send;
      for (uint64_t off = 0; off < bytes; off += step, ++c) {
        RingFrameV1 f = NewRingFrame(kFrameData, op->seq, me);
        f.item = static_cast<uint32_t>(i);
        f.rank = r;
        f.offset = off;
        f.len = std::min<uint64_t>(step, bytes - off);
        const int link = int((c + uint64_t(me)) % uint64_t(links));
        if (staged_) {
          // Sent from staging, after its link thread copies it out of the rank's memory.
          d.own.push_back(Send{f, StagingDest(d, f), link, src + off, op->ranks[r], op->ready_observed});
        } else {
          d.own.push_back(Send{f, src + off, link});
        }
      }
    }
  }
  h->chunks = c;
}

bool Ring::Fits(const SlotData& d, const RingFrameV1& f) const {
  if (f.item >= d.item_bytes.size()) return false;
  if (f.rank < 0 || f.rank >= topo_->world_size || topo_->node_of_rank[f.rank] != f.origin) return false;
  const uint64_t bytes = d.item_bytes[f.item];
  return f.len <= bytes && f.offset <= bytes - f.len;
}

char* Ring::StagingDest(const SlotData& d, const RingFrameV1& f) const {
  return d.staging + d.item_base[f.item] + uint64_t(f.rank) * d.item_bytes[f.item] + f.offset;
}

char* Ring::Dest(const SlotData& d, int l, const RingFrameV1& f) const {
  const uint64_t bytes = d.item_bytes[f.item];
  const scheduler::RankPart& p = d.op->parts[topo_->local_ranks()[l]];
  const scheduler::Item& it = p.items[f.item];
  char* base = it.kind == OpKind::kAllGatherList ? p.recv[it.recv_begin + f.rank]
                                                 : p.recv[it.recv_begin] + uint64_t(f.rank) * bytes;
  return base + f.offset;
}

bool Ring::LandChunk(int k, const RingFrameV1& f, std::vector<char>* scratch) {
  transport::Connection& conn = *prev_[k];
  SlotData* d;
  char* dst;
  {
    // The slot cannot end while this chunk is uncounted: land it unlocked.
    absl::MutexLock lock(&mu_);
    d = &data_[f.seq % data_.size()];
    dst = state_.local_ok(f.seq) && Fits(*d, f) ? (staged_ ? StagingDest(*d, f) : Dest(*d, 0, f)) : nullptr;
  }
  const uint64_t t0 = common::MonotonicNs();
  absl::Status st = absl::OkStatus();
  if (dst != nullptr) {
    st = conn.Recv(dst, f.len);
  } else {
    scratch->resize(std::min<uint64_t>(f.len, 1 << 20));
    for (uint64_t left = f.len; left > 0 && st.ok(); left -= std::min<uint64_t>(left, scratch->size())) {
      st = conn.Recv(scratch->data(), std::min<uint64_t>(left, scratch->size()));
    }
  }
  const bool link_ok = st.ok();
  if (link_ok) {
    chunk_ns_.Record(common::MonotonicNs() - t0);
    bytes_received_.fetch_add(f.len, std::memory_order_relaxed);
  }
  const std::vector<int>& local = topo_->local_ranks();
  for (size_t l = staged_ ? 0 : 1; st.ok() && dst != nullptr && l < local.size(); ++l) {
    if (!staged_) {
      memcpy(Dest(*d, int(l), f), dst, f.len);
      continue;
    }
    // The output may still be read by the rank's earlier work until it reaches this op.
    const engines::EngineRank* rank = d->op->ranks[local[l]];
    if (!d->op->ready_observed) st = options_.engine->WaitRankReady(rank, f.seq, stop_waits_);
    if (st.ok()) st = options_.engine->StageIn(Dest(*d, int(l), f), dst, f.len, rank);
  }
  Outcome out;
  {
    absl::MutexLock lock(&mu_);
    RingState::Effects fx;
    if (st.ok()) {
      state_.ChunkDone(k, f, dst != nullptr, &fx);
    } else {
      state_.ChunkFailed(f.seq, &fx);
    }
    ApplyLocked(fx, &out, dst);
  }
  Deliver(out);
  if (!link_ok) {
    OnLinkError(RingState::Side::kPrev, k, st);
  } else if (!st.ok()) {
    StagingFailed(st);
  }
  return st.ok();
}

void Ring::StagingFailed(const absl::Status& st) {
  if (closed_.load() || absl::IsCancelled(st)) return;  // Cancelled: the ring is stopping anyway.
  LOG(ERROR) << "job '" << job_->key() << "': ring staging copy failed: " << st;
  job_->Fail(common::Annotate(st, "ring staging copy (host <-> rank memory) failed: "), -1);
}

}  // namespace dmagather::server::cluster

#include "server/ingress/ingress.h"

#include <glog/logging.h>
#include <sched.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "abi/descriptor_v2.h"
#include "abi/graph_v1.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/futex.h"
#include "common/status.h"
#include "server/ingress/decoder.h"

namespace dmagather::server::ingress {

using scheduler::AllToAllLayout;
using scheduler::Item;
using scheduler::Job;
using scheduler::Op;
using scheduler::OpKind;
using scheduler::Rank;
using scheduler::RankPart;
using scheduler::Request;

Ingress::Ingress(const Options& options, engines::CopyEngine* engine, abi::DoorbellV1* doorbell, Hooks hooks)
    : options_(options), engine_(engine), doorbell_(doorbell), hooks_(std::move(hooks)) {}

Ingress::~Ingress() { Stop(); }

void Ingress::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Ingress::Stop() {
  stop_.store(true);
  abi::FetchAdd(&doorbell_->seq, 1u);
  common::FutexWakeAll(&doorbell_->seq);
  if (thread_.joinable()) thread_.join();
}

namespace {

bool Overlaps(const char* a, uint64_t an, const char* b, uint64_t bn) { return a < b + bn && b < a + an; }

}  // namespace

absl::Status Ingress::ValidateAllGather(const Request& d, int rank, const RegionTable& regions, int world_size,
                                        RankPart* part, Item* item) {
  const OpKind kind = item->kind;
  const uint64_t bytes = d.count * common::DtypeSize(d.dtype);
  const uint64_t out_bytes = kind == OpKind::kAllGather ? bytes * uint64_t(world_size) : bytes;
  DMAG_ASSIGN_OR_RETURN(item->send, regions.Resolve(d.send.region_id, d.send.offset, bytes, "send"));
  for (uint32_t i = 0; i < d.num_recv; ++i) {
    DMAG_ASSIGN_OR_RETURN(char* recv, regions.Resolve(d.recv[i].region_id, d.recv[i].offset, out_bytes, "recv"));
    part->recv.push_back(recv);
  }
  if (bytes == 0) return absl::OkStatus();
  // The send buffer may be this rank's own slot of the output (in place),
  // and must not overlap anything else the op writes.
  char* const* recv = part->recv.data() + item->recv_begin;
  for (uint32_t i = 0; i < d.num_recv; ++i) {
    if (!Overlaps(item->send, bytes, recv[i], out_bytes)) continue;
    const char* own_slot = kind == OpKind::kAllGather ? recv[0] + uint64_t(rank) * bytes : recv[rank];
    if (item->send == own_slot && (kind == OpKind::kAllGather || int(i) == rank)) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": send buffer overlaps output buffer ", i,
                     " but is not this rank's own slot of it (in place means send == recv + rank*count)"));
  }
  return absl::OkStatus();
}

absl::Status Ingress::ValidateAllToAll(const Request& d, int rank, const RegionTable& regions, int world_size,
                                       RankPart* part, Item* item) {
  auto invalid = [&](auto&&... what) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": ", scheduler::OpKindName(item->kind), " ", what...));
  };
  const uint64_t bytes = d.count * common::DtypeSize(d.dtype);
  const AllToAllLayout& a = d.a2a;
  if (a.send_stride < bytes || a.recv_stride < bytes || a.send_stride > (uint64_t{1} << 44) ||
      a.recv_stride > (uint64_t{1} << 44)) {
    return invalid("strides (send ", a.send_stride, ", recv ", a.recv_stride, " bytes) must be at least a chunk (",
                   bytes, " bytes) and at most 2^44");
  }
  const uint64_t world = uint64_t(world_size);
  const uint64_t send_span = (world - 1) * a.send_stride + bytes;
  const uint64_t recv_span = (world - 1) * a.recv_stride + bytes;
  DMAG_ASSIGN_OR_RETURN(item->send, regions.Resolve(d.send.region_id, d.send.offset, send_span, "send"));
  DMAG_ASSIGN_OR_RETURN(char* recv, regions.Resolve(d.recv[0].region_id, d.recv[0].offset, recv_span, "recv"));
  part->recv.push_back(recv);
  // Every chunk of the output is written while other ranks read this
  // rank's send: the two may not share a byte.
  if (bytes != 0 && Overlaps(item->send, send_span, recv, recv_span)) {
    return invalid("send and output buffers overlap (an all-to-all is out of place)");
  }
  item->a2a = a;
  return absl::OkStatus();
}

void Ingress::Validate(const Request& d, uint32_t expected_seq, int rank, const RegionTable& regions, int world_size,
                       RankPart* part) {
  if (part->items.empty()) part->submit_ns = d.submit_ns;
  if (!part->status.ok()) return;  // An earlier item of this op already failed.
  auto invalid = [&](std::string msg) {
    part->status = absl::InvalidArgumentError(absl::StrCat("rank ", rank, ": ", msg));
  };
  if (!d.refusal.ok()) {
    // The rank's own verdict (or an undecodable descriptor): keep its code,
    // and name the rank unless the client already did.
    const std::string prefix = absl::StrCat("rank ", rank, ": ");
    part->status = absl::StartsWith(d.refusal.message(), prefix) ? d.refusal : common::Annotate(d.refusal, prefix);
    return;
  }
  if (d.seq != expected_seq) {
    return invalid(absl::StrCat("descriptor carries sequence ", d.seq, ", the daemon expected ", expected_seq));
  }
  if (part->items.empty()) {
    part->graph_slot = d.graph_slot;
  } else if (d.graph_slot != part->graph_slot) {
    return invalid("the items of a coalesced op are not all captured into the same graph op");
  }
  if (d.graph_slot >= static_cast<int>(abi::kGraphSlotsV1)) {
    return invalid(absl::StrCat("graph slot ", d.graph_slot, " (0..", abi::kGraphSlotsV1 - 1, ")"));
  }
  const bool known = d.raw_op == uint32_t(OpKind::kAllGather) || d.raw_op == uint32_t(OpKind::kAllGatherList) ||
                     scheduler::IsAllToAll(static_cast<OpKind>(d.raw_op));
  if (!known) return invalid(absl::StrCat("unknown operation ", d.raw_op));
  const OpKind kind = static_cast<OpKind>(d.raw_op);
  if (d.dtype >= common::kNumDtypes) return invalid(absl::StrCat("unknown dtype ", d.dtype));
  const uint32_t want_recv = kind == OpKind::kAllGatherList ? static_cast<uint32_t>(world_size) : 1u;
  if (d.num_recv != want_recv) {
    return invalid(absl::StrCat("descriptor has ", d.num_recv, " output buffers, expected ", want_recv));
  }
  if (d.count > (uint64_t{1} << 44)) return invalid(absl::StrCat("count ", d.count, " is too large"));
  Item item;
  item.kind = kind;
  item.dtype = d.dtype;
  item.count = d.count;
  item.recv_begin = static_cast<uint32_t>(part->recv.size());
  item.num_recv = d.num_recv;
  absl::Status st = scheduler::IsAllToAll(kind) ? ValidateAllToAll(d, rank, regions, world_size, part, &item)
                                                : ValidateAllGather(d, rank, regions, world_size, part, &item);
  if (!st.ok()) {
    part->recv.resize(item.recv_begin);
    part->status = std::move(st);
    return;
  }
  part->items.push_back(item);
  if (part->graph_slot >= 0) {
    // A persistent op keeps its buffers mapped for as long as it is armed.
    part->holds.push_back(regions.Hold(d.send.region_id));
    for (uint32_t i = 0; i < d.num_recv; ++i) part->holds.push_back(regions.Hold(d.recv[i].region_id));
  }
}

void Ingress::SkipHandedOver(RankInput* in, uint64_t* head) {
  Request req;
  DecodeDescriptor(in->slots[*head % abi::kRingSlotsV1], &req);
  in->ring_head = ++*head;
  abi::StoreRelease(&in->ring->head, *head);
  if (in->skip_left == 0) in->skip_left = (req.items_following < abi::kMaxItemsPerOpV2 ? req.items_following : 0) + 1;
  if (--in->skip_left == 0) ++in->next_seq;
}

int Ingress::PollJob(const JobFeed& feed, uint64_t now_ns) {
  Job* job = feed.job.get();
  int consumed = 0;
  const int world = job->world_size();
  const int local = job->local_count();
  for (int r = 0; r < world; ++r) {
    if (feed.inputs[r] == nullptr) continue;  // On another node.
    RankInput& in = *feed.inputs[r];
    Rank& rank = *in.rank;
    if (rank.state() != Rank::State::kActive) continue;
    uint64_t head = in.ring_head;  // The daemon's own copy: the client cannot move it.
    const uint64_t tail = abi::LoadAcquire(&in.ring->tail);
    if (tail - head > abi::kRingSlotsV1) {
      // A client cannot publish more than the ring holds: its segment is corrupt.
      job->Fail(absl::InvalidArgumentError(
                    absl::StrCat("rank ", r, " corrupted its request ring (tail ", tail, ", head ", head, ")")),
                r);
      rank.set_state(Rank::State::kGone);
      continue;
    }
    while (head != tail) {
      const uint32_t seq = in.next_seq;
      if (in.skip_left != 0 || (in.items_left == 0 && job->HandedOverDone(seq))) {
        // An op the earlier daemon ended (a taken-back job): its done flag
        // is already up on every rank; read past its items.
        SkipHandedOver(&in, &head);
        ++consumed;
        continue;
      }
      Op* op;
      if (in.items_left == 0) {
        op = job->SlotFor(seq, now_ns);
        if (op == nullptr) break;  // An older op still holds the slot: leave it in the ring.
      } else {
        op = in.current;  // The rest of a coalesced op.
      }
      Request req;
      DecodeDescriptor(in.slots[head % abi::kRingSlotsV1], &req);
      in.ring_head = ++head;
      abi::StoreRelease(&in.ring->head, head);
      ++consumed;
      const bool live = op->state.load(std::memory_order_acquire) == Op::kWaiting && op->seq == seq;
      RankPart& part = op->parts[r];
      if (in.items_left == 0) {
        // First item: the op now counts in the rank's in-flight ops.
        rank.inflight.fetch_add(1, std::memory_order_acq_rel);
        part.started = true;
        const uint32_t following = req.items_following;
        if (following >= abi::kMaxItemsPerOpV2 && req.refusal.ok()) {
          part.status = absl::InvalidArgumentError(absl::StrCat("rank ", r, ": coalesced op of ", following + 1,
                                                                " items (at most ", abi::kMaxItemsPerOpV2, ")"));
        }
        // An impossible item count fails this op alone; the descriptors
        // after it are read as the ops they claim to be.
        in.items_left = (following < abi::kMaxItemsPerOpV2 ? following : 0) + 1;
        part.items_expected = in.items_left;
        in.current = op;
      } else if (req.items_following + 1 != in.items_left && part.status.ok()) {
        part.status =
            absl::InvalidArgumentError(absl::StrCat("rank ", r, ": coalesced op #", seq, " expected ", in.items_left,
                                                    " more item(s), descriptor says ", req.items_following + 1));
      }
      if (live) Validate(req, seq, r, in.regions, world, &part);
      if (live && job->multi_node() && part.status.ok() && scheduler::IsAllToAll(static_cast<OpKind>(req.raw_op))) {
        // The ring carries all-gathers only: every node's daemon says so for this op.
        part.status = common::FallbackError(absl::StrCat(scheduler::OpKindName(static_cast<OpKind>(req.raw_op)),
                                                         " is served within one node; this job spans nodes"));
      }
      if (--in.items_left != 0) continue;
      // Every item of this rank's part is in.
      in.current = nullptr;
      ++in.next_seq;
      if (!live) continue;  // The op was failed (job stopped) before its last items came.
      part.arrived = true;
      ++op->arrived;
      if (op->arrived == local && !job->failed()) job->Dispatch(op, engine_);
    }
  }
  return consumed;
}

bool Ingress::AnyPending() const {
  for (const JobFeed& feed : jobs_) {
    if (!feed.job->all_joined() || feed.job->handing_back()) continue;
    for (const auto& in : feed.inputs) {
      if (in == nullptr) continue;
      if (in->rank->state() != Rank::State::kActive) continue;
      if (abi::LoadSeqCst(&in->ring->tail) != in->ring_head) return true;
    }
  }
  return false;
}

int Ingress::PollOnce(uint64_t now_ns, bool sweep) {
  const uint64_t v = hooks_.version();
  if (v != version_) {
    jobs_ = hooks_.snapshot();
    version_ = v;
  }
  int consumed = 0;
  for (const JobFeed& feed : jobs_) {
    // A job handed back is read again by the job its ranks join next.
    if (!feed.job->all_joined() || feed.job->handing_back()) continue;
    consumed += PollJob(feed, now_ns);
    consumed += feed.job->PollPersistent(engine_);
    if (sweep) feed.job->Sweep(now_ns, options_.op_timeout);
  }
  epoch_.fetch_add(1, std::memory_order_acq_rel);
  return consumed;
}

void Ingress::Kick() {
  abi::FetchAdd(&doorbell_->seq, 1u);
  common::FutexWakeAll(&doorbell_->seq);
}

void Ingress::Loop() {
  uint64_t last_sweep = 0;
  uint64_t last_work = options_.clock->NowNs();
  common::Backoff backoff(options_.spin_iterations);
  while (!stop_.load(std::memory_order_relaxed)) {
    const uint64_t now = options_.clock->NowNs();
    const bool sweep = now - last_sweep > 2'000'000;
    if (sweep) last_sweep = now;
    const int consumed = PollOnce(now, sweep);
    if (consumed != 0) {
      last_work = now;
      backoff.Reset();
      continue;
    }
    if (!backoff.Pause()) continue;
    if (now - last_work < options_.stay_awake_ns) {  // A job is active: stay awake.
      sched_yield();
      continue;
    }
    const uint32_t bell = abi::LoadSeqCst(&doorbell_->seq);
    abi::StoreSeqCst(&doorbell_->sleeping, 1u);
    // Armed persistent (graph) ops are started by a GPU write of their ready
    // flag, which rings no doorbell: look again soon while any is armed.
    bool persistent = false;
    for (const JobFeed& feed : jobs_) persistent |= feed.job->has_persistent();
    if (!AnyPending() && !stop_.load()) {
      // With no job at all there is nothing to sweep: sleep until a rank (or
      // the reaper, Kick) rings; else wake every 10 ms for timeouts.
      const uint64_t timeout_ns = persistent      ? PersistentPollNs(options_.clock->NowNs() - last_work)
                                  : jobs_.empty() ? kIdlePollNs
                                                  : 10'000'000;
      sleeps_.fetch_add(1, std::memory_order_relaxed);
      common::FutexWait(&doorbell_->seq, bell, timeout_ns);
    }
    epoch_.fetch_add(1, std::memory_order_acq_rel);  // Asleep: no snapshot was being read.
    abi::StoreSeqCst(&doorbell_->sleeping, 0u);
    backoff.Reset();
  }
}

}  // namespace dmagather::server::ingress

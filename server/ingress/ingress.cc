#include "server/ingress/ingress.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/futex.h"
#include "server/scheduler/planner.h"

namespace dmagather::server::ingress {

using scheduler::Job;
using scheduler::Op;
using scheduler::RankPart;

Ingress::Ingress(const Options& options, engines::CopyEngine* engine, abi::DoorbellV1* doorbell, Hooks hooks)
    : options_(options), engine_(engine), doorbell_(doorbell), hooks_(std::move(hooks)) {}

Ingress::~Ingress() { Stop(); }

void Ingress::Start() { thread_ = std::thread([this] { Loop(); }); }

void Ingress::Stop() {
  stop_.store(true);
  abi::FetchAdd(&doorbell_->seq, 1u);
  common::FutexWakeAll(&doorbell_->seq);
  if (thread_.joinable()) thread_.join();
}

namespace {

bool Overlaps(const char* a, uint64_t an, const char* b, uint64_t bn) { return a < b + bn && b < a + an; }

// Copies the fixed part and the output entries the descriptor says it uses.
void CopyDescriptor(const abi::DescriptorV1& shared, abi::DescriptorV1* d) {
  std::memcpy(d, &shared, offsetof(abi::DescriptorV1, recv));
  d->num_recv = std::min(d->num_recv, abi::kMaxRanksV1 + 1);  // kMaxRanksV1 + 1 fails validation.
  std::memcpy(d->recv, shared.recv, sizeof(abi::BufferRefV1) * std::min(d->num_recv, abi::kMaxRanksV1));
}

}  // namespace

void Ingress::Validate(const abi::DescriptorV1& d, uint32_t expected_seq, const Session& session,
                       int world_size, RankPart* part) {
  part->opcode = d.op;
  part->dtype = d.dtype;
  part->count = d.count;
  part->submit_ns = d.submit_ns;
  auto invalid = [&](std::string msg) {
    part->status = absl::InvalidArgumentError(absl::StrCat("rank ", session.rank(), ": ", msg));
  };
  if (d.stamp != abi::kDescriptorStampV1) {
    return invalid(absl::StrFormat("descriptor stamp 0x%08x is not v1 (0x%08x): client and daemon versions differ",
                                   d.stamp, abi::kDescriptorStampV1));
  }
  if (d.seq != expected_seq) {
    return invalid(absl::StrCat("descriptor carries sequence ", d.seq, ", the daemon expected ", expected_seq));
  }
  if (d.op != abi::kOpAllGather && d.op != abi::kOpAllGatherList) {
    return invalid(absl::StrCat("unknown operation ", d.op));
  }
  if (d.dtype >= common::kNumDtypes) return invalid(absl::StrCat("unknown dtype ", d.dtype));
  const uint32_t want_recv = d.op == abi::kOpAllGather ? 1u : static_cast<uint32_t>(world_size);
  if (d.num_recv != want_recv) {
    return invalid(absl::StrCat("descriptor has ", d.num_recv, " output buffers, expected ", want_recv));
  }
  if (d.count > (uint64_t{1} << 44)) return invalid(absl::StrCat("count ", d.count, " is too large"));
  const uint64_t bytes = d.count * common::DtypeSize(d.dtype);
  const uint64_t out_bytes = d.op == abi::kOpAllGather ? bytes * uint64_t(world_size) : bytes;

  auto send = session.Resolve(d.send.region_id, d.send.offset, bytes, "send");
  if (!send.ok()) {
    part->status = send.status();
    return;
  }
  part->send = *send;
  for (uint32_t i = 0; i < d.num_recv; ++i) {
    auto recv = session.Resolve(d.recv[i].region_id, d.recv[i].offset, out_bytes, "recv");
    if (!recv.ok()) {
      part->status = recv.status();
      return;
    }
    part->recv.push_back(*recv);
  }
  if (bytes == 0) return;
  // The send buffer may be this rank's own slot of the output (in place),
  // and must not overlap anything else the op writes.
  const int rank = session.rank();
  for (uint32_t i = 0; i < d.num_recv; ++i) {
    if (!Overlaps(part->send, bytes, part->recv[i], out_bytes)) continue;
    const char* own_slot = d.op == abi::kOpAllGather ? part->recv[0] + uint64_t(rank) * bytes : part->recv[rank];
    if (part->send == own_slot && (d.op == abi::kOpAllGather || int(i) == rank)) continue;
    return invalid(absl::StrCat("send buffer overlaps output buffer ", i,
                                " but is not this rank's own slot of it (in place means send == recv + ",
                                "rank*count)"));
  }
}

int Ingress::PollJob(Job* job, uint64_t now_ns) {
  int consumed = 0;
  const int world = job->world_size();
  for (int r = 0; r < world; ++r) {
    Session* s = job->session(r);
    if (s->state() != Session::State::kActive) continue;
    abi::RingV1* ring = s->view().ring;
    uint64_t head = s->ring_head;  // The daemon's own copy: the client cannot move it.
    const uint64_t tail = abi::LoadAcquire(&ring->tail);
    if (tail - head > abi::kRingSlotsV1) {
      // A client cannot publish more than the ring holds: its segment is corrupt.
      job->Fail(absl::InvalidArgumentError(absl::StrCat("rank ", r, " corrupted its request ring (tail ", tail,
                                                        ", head ", head, ")")),
                r);
      s->set_state(Session::State::kGone);
      continue;
    }
    while (head != tail) {
      const uint32_t seq = s->next_seq;
      Op* op = job->SlotFor(seq, now_ns);
      if (op == nullptr) break;  // An older op still holds the slot: leave it in the ring.
      // Validate a private copy: the client could rewrite the slot while it is read.
      abi::DescriptorV1 d;
      CopyDescriptor(s->view().slots[head % abi::kRingSlotsV1], &d);
      s->inflight.fetch_add(1, std::memory_order_acq_rel);
      RankPart& part = op->parts[r];
      Validate(d, seq, *s, world, &part);
      part.arrived = true;
      ++op->arrived;
      ++s->next_seq;
      s->ring_head = ++head;
      abi::StoreRelease(&ring->head, head);
      ++consumed;
      if (op->arrived == world && !job->failed()) Dispatch(job, op);
    }
  }
  return consumed;
}

void Ingress::Dispatch(Job* job, Op* op) {
  op->matched_ns = common::MonotonicNs();
  for (int r = 0; r < job->world_size(); ++r) {
    const RankPart& p = op->parts[r];
    if (!p.status.ok()) {
      job->FinishOp(op, absl::InvalidArgumentError(absl::StrCat("allgather #", op->seq, " failed: ",
                                                                p.status.message())),
                    r);
      return;
    }
  }
  absl::Status agree = scheduler::CheckAgreement(*op);
  if (!agree.ok()) {
    job->FinishOp(op, agree, -1);
    return;
  }
  scheduler::BuildPlan(op);
  const int world = job->world_size();
  op->flag_seq = op->seq;
  op->ready_flags.resize(world);
  op->devices.resize(world);
  for (int r = 0; r < world; ++r) {
    const Session* s = job->session(r);
    op->ready_flags[r] = s->ready_flag_device;
    op->devices[r] = s->cuda_device;
  }
  op->state.store(Op::kRunning, std::memory_order_release);
  engine_->Execute(op);
  // Recorded here, not in FinishOp: the engine may finish the op (and the
  // slot be reused) before Execute returns, so the op is not touched again.
  job->counters.hop_latency.Record(common::MonotonicNs() - op->matched_ns);
}

bool Ingress::AnyPending() const {
  for (const auto& job : jobs_) {
    if (!job->all_joined()) continue;
    for (int r = 0; r < job->world_size(); ++r) {
      Session* s = job->session(r);
      if (s->state() != Session::State::kActive) continue;
      if (abi::LoadSeqCst(&s->view().ring->tail) != s->ring_head) return true;
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
  for (const auto& job : jobs_) {
    if (!job->all_joined()) continue;
    consumed += PollJob(job.get(), now_ns);
    if (sweep) job->Sweep(now_ns, options_.op_timeout);
  }
  return consumed;
}

void Ingress::Loop() {
  uint64_t last_sweep = 0, last_reap = 0;
  common::Backoff backoff(options_.spin_iterations);
  while (!stop_.load(std::memory_order_relaxed)) {
    const uint64_t now = common::MonotonicNs();
    const bool sweep = now - last_sweep > 2'000'000;
    if (sweep) last_sweep = now;
    const int consumed = PollOnce(now, sweep);
    if (now - last_reap > 20'000'000) {
      hooks_.reap();
      last_reap = now;
    }
    if (consumed != 0) {
      backoff.Reset();
      continue;
    }
    if (!backoff.Pause()) continue;
    const uint32_t bell = abi::LoadSeqCst(&doorbell_->seq);
    abi::StoreSeqCst(&doorbell_->sleeping, 1u);
    if (!AnyPending() && !stop_.load()) common::FutexWait(&doorbell_->seq, bell, 10'000'000);
    abi::StoreSeqCst(&doorbell_->sleeping, 0u);
    backoff.Reset();
  }
}

}  // namespace dmagather::server::ingress

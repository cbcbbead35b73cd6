// DeviceWorker: see device_worker.h.
#include "server/engines/gpu/device_worker.h"

#include <pthread.h>
#include <sys/prctl.h>

#include <algorithm>
#include <optional>
#include <string>

#include "common/status.h"
#include "server/engines/gpu/backoff.h"
#include "server/engines/gpu/gpu_rank.h"

namespace dmagather::server::engines::gpu {
namespace {

// The other end of a copy issued on `device` (its link), or `device` itself.
int LinkPeer(const CopyCmd& c, int device) { return c.src_device == device ? c.dst_device : c.src_device; }
}  // namespace

DeviceWorker::DeviceWorker(const Shared& shared, int device)
    : s_(shared),
      rt_(*shared.runtime),
      device_(device),
      events_(*shared.runtime, device),
      completion_(device, *shared.runtime, events_, *shared.ops, *shared.clock, shared.awake_ns, *shared.abandon) {}

DeviceWorker::~DeviceWorker() {
  StopIssuing();
  completion_.Stop();
  rt_.SetDevice(device_).IgnoreError();
  lanes_.reset();
}

absl::Status DeviceWorker::Init() {
  DMAG_RETURN_IF_ERROR(rt_.SetDevice(device_));
  lanes_ = std::make_unique<LaneSet>(&rt_, device_, s_.streams, kLanesKept);
  DMAG_RETURN_IF_ERROR(events_.Fill(kEndEvents));
  copies_.reserve(64);
  stream_used_.resize(s_.streams);
  return absl::OkStatus();
}

void DeviceWorker::Start(bool issuing_thread) {
  completion_.Start();
  if (!issuing_thread) return;
  // As the completion thread: a burst of ops costs the issuer no wake-up.
  issuer_ = std::make_unique<Handoff<InFlightOp*>>(kIssueSlots, *s_.clock, s_.awake_ns);
  issuer_thread_ = std::thread([this] { IssuerLoop(); });
}

void DeviceWorker::StopIssuing() {
  if (issuer_ == nullptr) return;
  issuer_->Stop();
  if (issuer_thread_.joinable()) issuer_thread_.join();
}

void DeviceWorker::Post(InFlightOp* t) {
  if (issuer_ == nullptr) {
    Issue(t);
    return;
  }
  issuer_->Post(t);
}

void DeviceWorker::IssuerLoop() {
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  pthread_setname_np(pthread_self(), ("dmag-issue-" + std::to_string(device_)).c_str());
  rt_.BindThread(device_);
  Handoff<InFlightOp*>& q = *issuer_;
  while (q.Wait()) {  // Until stopped with nothing left.
    Issue(q.Front());
    q.Pop();  // Pending until issued: Stop's drain waits for the issue itself.
  }
}

void DeviceWorker::Issue(InFlightOp* t) {
  const EngineOp& op = *t->op();
  copies_.clear();
  for (const CopyCmd& c : op.plan.copies) {
    if (s_.peers->IssuingDevice(c.src_device, c.dst_device) == device_) copies_.push_back(c);
  }
  GpuEvent end = nullptr;
  absl::Status st;
  s_.lockstep->WaitForEarlier(t->issue_order());
  if (s_.abandon->load(std::memory_order_relaxed)) {
    st = absl::UnavailableError("dmagatherd stopped before the op's copies were issued");
  } else {
    st = Enqueue(t, &end);
    if (st.ok()) {
      uint64_t bytes = 0;
      for (const CopyCmd& c : copies_) bytes += c.bytes;
      issued_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    }
  }
  t->set_end(device_, end);  // Before the share counts as enqueued (WriteDone reads it).
  if (!st.ok()) t->ShareFailed(st);
  if (t->ShareEnqueued()) s_.lockstep->Enqueued(t->issue_order());
  if (end == nullptr && lane_ != nullptr && lane_->job == op.job_id && !st.ok()) {
    // Something may be queued on the lane with no end to see it done: it
    // is never handed to another job.
    lane_->open.fetch_add(1, std::memory_order_acq_rel);
  }
  if (end != nullptr) {
    t->OpenEnd();
    lane_->open.fetch_add(1, std::memory_order_acq_rel);
    completion_.Post(Share{t, end, lane_});
  }
  s_.ops->Close(t, st);
}

void DeviceWorker::PlanShare(const EngineOp& op) {
  WavePlanOptions wo;
  wo.chunk_bytes = s_.chunk_bytes;
  // Small ops stay on stream 0 (fewer calls = lower hop latency); a stream
  // is added per chunk_bytes of payload, and one per peer link when the
  // share reads (or writes) several peers, so that every link runs at once
  // (a stream - and a copy graph's chain - runs its copies one after
  // another), up to the lane's streams.
  uint64_t dev_bytes = 0;
  uint64_t peer_mask = 0;  // Devices beyond 64 share bit 63: only the count matters.
  for (const CopyCmd& c : copies_) {
    dev_bytes += c.bytes;
    const int peer = LinkPeer(c, device_);
    if (peer != device_ && peer >= 0) peer_mask |= uint64_t{1} << std::min(peer, 63);
  }
  const int links = __builtin_popcountll(peer_mask);
  wo.streams = static_cast<int>(
      std::min<uint64_t>(s_.streams, std::max<uint64_t>({1, dev_bytes / wo.chunk_bytes, uint64_t(links)})));
  wo.stream_per_link = links > 1;
  wo.device = device_;
  wo.max_batch = s_.max_batch;
  wo.world_size = static_cast<int>(op.ranks.size());
  PlanWaves(copies_, wo, &chunks_, &batches_);
  s_.figures->chunks.fetch_add(chunks_.size(), std::memory_order_relaxed);
}

absl::Status DeviceWorker::Enqueue(InFlightOp* t, GpuEvent* end) {
  const EngineOp& op = *t->op();
  *end = nullptr;
  DMAG_RETURN_IF_ERROR(rt_.SetDevice(device_));
  DMAG_ASSIGN_OR_RETURN(lane_, lanes_->Take(op.job_id));
  PlanShare(op);
  const uint64_t t_plan = s_.clock->NowNs();
  s_.watch->Begin(device_, &op, "ready waits");
  absl::Status st = WaitReady(op);
  s_.figures->memops_ns.Record(s_.clock->NowNs() - t_plan);
  if (st.ok()) st.Update(Copy(op));
  if (st.ok() && t->finisher() == device_) st.Update(WriteDone(t));
  s_.watch->Begin(device_, &op, "end event");
  absl::Status ended = EndShare(end);
  s_.watch->End(device_);
  st.Update(ended);
  return st;
}

absl::Status DeviceWorker::WaitReady(const EngineOp& op) {
  if (!rt_.device_waits()) return absl::OkStatus();  // Gated on the CPU before the op was routed.
  // Every flag already at the op (a graph replay, or the ranks' streams
  // wrote them before the last descriptor came): the device wait would pass
  // at once; skip the driver call. The flag writes follow the producers'
  // work in the ranks' streams, so the inputs are complete, as for the CPU
  // gate.
  if (RanksReady(op)) {
    s_.figures->ready_seen.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  flags_.clear();
  for (const EngineRank* r : op.ranks) {
    const uint64_t addr = r != nullptr ? AsGpu(r)->ready_flag() : 0;
    if (addr != 0) flags_.push_back(addr);
  }
  if (flags_.empty()) return absl::OkStatus();
  return rt_.WaitValues(device_, lane_->streams[0], flags_.data(), flags_.size(), op.seq);
}

absl::Status DeviceWorker::Copy(const EngineOp& op) {
  LaneSet::Lane& lane = *lane_;
  GpuStream s0 = lane.streams[0];
  absl::Status st;
  std::vector<char>& used = stream_used_;
  std::fill(used.begin(), used.end(), 0);
  for (const WaveBatch& b : batches_) used[b.stream] = 1;
  bool fan_out = false;
  for (size_t s = 1; s < used.size(); ++s) fan_out |= used[s] != 0;
  if (fan_out) {
    st.Update(rt_.RecordEvent(lane.gate, s0));
    for (size_t s = 1; st.ok() && s < used.size(); ++s) {
      if (used[s]) st.Update(rt_.StreamWaitEvent(lane.streams[s], lane.gate));
    }
  }
  const uint64_t t_copies = s_.clock->NowNs();
  s_.watch->Begin(device_, &op, "copy calls");
  for (const WaveBatch& b : batches_) {
    if (!st.ok()) break;
    st.Update(CopyInOrder(lane.streams[b.stream], chunks_.data() + b.begin, b.end - b.begin, !fan_out));
  }
  s_.figures->copies_ns.Record(s_.clock->NowNs() - t_copies);
  // Join every stream back into stream 0 (also after an error: the end
  // event must follow everything that was enqueued).
  for (size_t s = 1; fan_out && s < used.size(); ++s) {
    if (!used[s]) continue;
    st.Update(rt_.RecordEvent(lane.joins[s], lane.streams[s]));
    st.Update(rt_.StreamWaitEvent(s0, lane.joins[s]));
  }
  return st;
}

// A copy call under the order locks of every device whose memory it
// touches; one that also destroys graphs over released memory under every
// device's (checked holding the device's own lock: releases are made under
// all of them, so none can come in between).
absl::Status DeviceWorker::CopyInOrder(GpuStream stream, const CopyCmd* chunks, size_t n, bool sole) {
  DeviceOrder& order = *s_.order;
  DeviceOrder::DeviceSet touched = DeviceOrder::Of(device_);
  for (size_t i = 0; i < n; ++i) {
    touched |= DeviceOrder::Of(chunks[i].src_device) | DeviceOrder::Of(chunks[i].dst_device);
  }
  std::optional<DeviceOrder::Hold> hold(std::in_place, order, touched);
  if (touched != order.all() && rt_.CopyTouchesOthers(device_)) {
    hold.reset();
    hold.emplace(order, order.all());
  }
  return rt_.Copy(device_, stream, chunks, n, sole);
}

absl::Status DeviceWorker::WriteDone(InFlightOp* t) {
  // Every other share enqueued (its end event set): they wait for nothing
  // of this op's finisher (Lockstep looks at op n - 1).
  const EngineOp& op = *t->op();
  s_.watch->Begin(device_, &op, "waiting for the op's other shares to be enqueued");
  const uint64_t t0 = s_.clock->NowNs();
  while (t->unenqueued() > 1) {
    if (s_.abandon->load(std::memory_order_relaxed)) return absl::UnavailableError("dmagatherd stopped");
    Backoff(s_.clock->NowNs() - t0);
  }
  if (t->failed()) return absl::OkStatus();  // A share failed: the CPU publishes, with the error.
  // An earlier op of the job failed at issue and has not ended: its error
  // record must come before any later done flag (every earlier op is
  // enqueued by now: Lockstep).
  if (JobLoads::Unsettled(t->load())) return absl::OkStatus();
  GpuStream s0 = lane_->streams[0];
  s_.watch->Begin(device_, &op, "waits on the other devices' shares, done write");
  const int devices = s_.peers->devices();
  for (int d = 0; d < devices; ++d) {
    if (d == device_ || t->end(d) == nullptr) continue;
    DeviceOrder::Hold hold(*s_.order, DeviceOrder::Of(device_) | DeviceOrder::Of(d));  // Two contexts.
    DMAG_RETURN_IF_ERROR(rt_.StreamWaitEvent(s0, t->end(d)));
  }
  flags_.clear();
  for (const EngineRank* r : op.ranks) {
    if (r != nullptr) flags_.push_back(AsGpu(r)->done_flag());
  }
  DMAG_RETURN_IF_ERROR(rt_.WriteValues(device_, s0, flags_.data(), flags_.size(), op.seq));
  s_.figures->done_written.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status DeviceWorker::EndShare(GpuEvent* end) {
  GpuEvent e = events_.Take();
  if (e == nullptr) return absl::ResourceExhaustedError("no event for the end of an op");
  absl::Status rs = rt_.RecordEvent(e, lane_->streams[0]);
  if (!rs.ok()) {
    events_.Give(e);
    return rs;
  }
  *end = e;
  return absl::OkStatus();
}

}  // namespace dmagather::server::engines::gpu

// GpuEngine (gpu_engine.h): the per-op path - into the CPU gate, routing an op's
// copies to their issuing devices, issuing each device's share (ready
// waits, copies, the finisher's done write, end event). The completion
// threads are in gpu_engine_complete.cc; set-up, imports and stop in
// gpu_engine.cc; the cross-device order and the lanes in gpu_engine_order.cc.
#include <glog/logging.h>
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/cpu_relax.h"
#include "common/status.h"
#include "server/engines/gpu/backoff.h"
#include "server/engines/gpu/gpu_engine.h"
#include "server/engines/gpu/gpu_rank.h"

namespace dmagather::server::engines::gpu {
namespace {

// The other end of a copy issued on `device` (its link), or `device` itself.
int LinkPeer(const CopyCmd& c, int device) { return c.src_device == device ? c.dst_device : c.src_device; }

}  // namespace

GpuEvent GpuEngine::TakeEndEvent(Device& dev) {
  {
    absl::MutexLock lock(&pool_mu_);
    std::vector<GpuEvent>& free_end = free_end_[dev.ordinal];
    if (!free_end.empty()) {
      GpuEvent e = free_end.back();
      free_end.pop_back();
      return e;
    }
  }
  auto e = runtime_->CreateEvent(dev.ordinal);
  return e.ok() ? *e : nullptr;
}

bool GpuEngine::RanksReady(const EngineOp& op) {
  if (op.ready_observed) return true;  // A graph replay: the ingress thread saw the flags.
  for (const EngineRank* r : op.ranks) {
    if (r == nullptr) continue;
    const uint32_t* w = AsGpu(r)->ready_word();
    if (w == nullptr) continue;
    const uint32_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    if (static_cast<int32_t>(v - op.seq) < 0) return false;
  }
  return true;
}

absl::Status GpuEngine::WaitReady(Device& dev, const EngineOp& op) {
  if (!runtime_->device_waits()) return absl::OkStatus();  // Gated on the CPU before Issue.
  // Every flag already at the op (a graph replay, or the ranks' streams
  // wrote them before the last descriptor came): the device wait would pass
  // at once; skip the driver call. The flag writes follow the producers'
  // work in the ranks' streams, so the inputs are complete, as for the CPU
  // gate.
  if (RanksReady(op)) {
    ready_seen_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  dev.flags.clear();
  for (const EngineRank* r : op.ranks) {
    const uint64_t addr = r != nullptr ? AsGpu(r)->ready_flag() : 0;
    if (addr != 0) dev.flags.push_back(addr);
  }
  if (dev.flags.empty()) return absl::OkStatus();
  return runtime_->WaitValues(dev.ordinal, dev.lane->streams[0], dev.flags.data(), dev.flags.size(), op.seq);
}

absl::Status GpuEngine::WriteDone(Device& dev, OpTrack* t) {
  // Every other share enqueued (its end event in t->ends): they wait for
  // nothing of this op's finisher (WaitForEarlierOps looks at op n - 1).
  watch_->Begin(dev.ordinal, t->op, "waiting for the op's other shares to be enqueued");
  const uint64_t t0 = clock_.NowNs();
  while (t->unenqueued.load(std::memory_order_acquire) > 1) {
    if (abandon_.load(std::memory_order_relaxed)) return absl::UnavailableError("dmagatherd stopped");
    Backoff(clock_.NowNs() - t0);
  }
  {
    absl::MutexLock lock(&t->mu);
    if (!t->status.ok()) return absl::OkStatus();  // A share failed: the CPU publishes, with the error.
  }
  // An earlier op of the job failed at issue and has not ended: its error
  // record must come before any later done flag (every earlier op is
  // enqueued by now: WaitForEarlierOps).
  if (JobLoads::Unsettled(t->load)) return absl::OkStatus();
  GpuStream s0 = dev.lane->streams[0];
  watch_->Begin(dev.ordinal, t->op, "waits on the other devices' shares, done write");
  for (int d = 0; d < num_devices_; ++d) {
    if (d == dev.ordinal || t->ends[d] == nullptr) continue;
    DeviceOrder::Hold hold(*order_, DeviceOrder::Of(dev.ordinal) | DeviceOrder::Of(d));  // Two contexts.
    DMAG_RETURN_IF_ERROR(runtime_->StreamWaitEvent(s0, t->ends[d]));
  }
  dev.flags.clear();
  for (const EngineRank* r : t->op->ranks) {
    if (r != nullptr) dev.flags.push_back(AsGpu(r)->done_flag());
  }
  DMAG_RETURN_IF_ERROR(runtime_->WriteValues(dev.ordinal, s0, dev.flags.data(), dev.flags.size(), t->op->seq));
  done_written_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status GpuEngine::EnqueueDevice(Device& dev, OpTrack* t, GpuEvent* end) {
  const EngineOp& op = *t->op;
  GpuRuntime& rt = *runtime_;
  *end = nullptr;
  DMAG_RETURN_IF_ERROR(rt.SetDevice(dev.ordinal));
  DMAG_ASSIGN_OR_RETURN(dev.lane, dev.lanes->Take(op.job_id));
  Lane& lane = *dev.lane;
  WavePlanOptions wo;
  wo.chunk_bytes = chunk_bytes_;
  // Small ops stay on stream 0 (fewer calls = lower hop latency); a stream
  // is added per chunk_bytes of payload, and one per peer link when the
  // share reads (or writes) several peers, so that every link runs at once
  // (a stream - and a copy graph's chain - runs its copies one after
  // another), up to streams_per_device.
  uint64_t dev_bytes = 0;
  uint64_t peer_mask = 0;  // Devices beyond 64 share bit 63: only the count matters.
  for (const CopyCmd& c : dev.copies) {
    dev_bytes += c.bytes;
    const int peer = LinkPeer(c, dev.ordinal);
    if (peer != dev.ordinal && peer >= 0) peer_mask |= uint64_t{1} << std::min(peer, 63);
  }
  const int links = __builtin_popcountll(peer_mask);
  wo.streams = static_cast<int>(
      std::min<uint64_t>(streams_per_device_, std::max<uint64_t>({1, dev_bytes / wo.chunk_bytes, uint64_t(links)})));
  wo.stream_per_link = links > 1;
  wo.device = dev.ordinal;
  wo.max_batch = options_.max_batch;
  wo.world_size = static_cast<int>(op.ranks.size());
  std::vector<CopyCmd>& chunks = dev.chunks;
  PlanWaves(dev.copies, wo, &chunks, &dev.batches);
  chunks_stat_.fetch_add(chunks.size(), std::memory_order_relaxed);
  GpuStream s0 = lane.streams[0];
  const uint64_t t_plan = clock_.NowNs();
  watch_->Begin(dev.ordinal, &op, "ready waits");
  absl::Status st = WaitReady(dev, op);
  const uint64_t t_waits = clock_.NowNs();
  memops_ns_.Record(t_waits - t_plan);
  if (st.ok()) {
    std::vector<char>& used = dev.stream_used;
    std::fill(used.begin(), used.end(), 0);
    for (const WaveBatch& b : dev.batches) used[b.stream] = 1;
    bool fan_out = false;
    for (size_t s = 1; s < used.size(); ++s) fan_out |= used[s] != 0;
    if (fan_out) {
      st.Update(rt.RecordEvent(lane.gate, s0));
      for (size_t s = 1; st.ok() && s < used.size(); ++s) {
        if (used[s]) st.Update(rt.StreamWaitEvent(lane.streams[s], lane.gate));
      }
    }
    const uint64_t t_copies = clock_.NowNs();
    watch_->Begin(dev.ordinal, &op, "copy calls");
    for (const WaveBatch& b : dev.batches) {
      if (!st.ok()) break;
      st.Update(CopyInOrder(dev, lane.streams[b.stream], chunks.data() + b.begin, b.end - b.begin, !fan_out));
    }
    copies_ns_.Record(clock_.NowNs() - t_copies);
    // Join every stream back into stream 0 (also after an error: the end
    // event must follow everything that was enqueued).
    for (size_t s = 1; fan_out && s < used.size(); ++s) {
      if (!used[s]) continue;
      st.Update(rt.RecordEvent(lane.joins[s], lane.streams[s]));
      st.Update(rt.StreamWaitEvent(s0, lane.joins[s]));
    }
    if (st.ok() && t->finisher == dev.ordinal) st.Update(WriteDone(dev, t));
  }
  watch_->Begin(dev.ordinal, &op, "end event");
  absl::Status ended = EndShare(dev, end);
  watch_->End(dev.ordinal);
  st.Update(ended);
  return st;
}

absl::Status GpuEngine::EndShare(Device& dev, GpuEvent* end) {
  GpuRuntime& rt = *runtime_;
  GpuStream s0 = dev.lane->streams[0];
  absl::Status st;
  GpuEvent e = TakeEndEvent(dev);
  if (e == nullptr) {
    st.Update(absl::ResourceExhaustedError("no event for the end of an op"));
    return st;
  }
  absl::Status rs = rt.RecordEvent(e, s0);
  if (!rs.ok()) {
    st.Update(rs);
    absl::MutexLock lock(&pool_mu_);
    free_end_[dev.ordinal].push_back(e);
    return st;
  }
  *end = e;
  return st;
}

void GpuEngine::Execute(EngineOp* op) {
  ops_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(op->plan.bytes, std::memory_order_relaxed);
  if (op->plan.copies.empty()) {  // Nothing to move (one rank in place, or count 0).
    op->OnEngineDone(absl::OkStatus());
    return;
  }
  // CPU gating (ready_gate.h): issue now when no op of its job waits
  // before it and its ranks are ready (or device waits may take it); else
  // the gate holds it (in order within its job; other jobs' ops pass it).
  if (gate_ == nullptr) {  // Device waits with no bound (tests).
    Issue(op);
    return;
  }
  if (gate_->Submit(op) && runtime_->device_waits()) held_ahead_.fetch_add(1, std::memory_order_relaxed);
}

void GpuEngine::CountRouting(uint64_t same, uint64_t pushes) {
  if (same != 0) {
    same_device_.fetch_add(same, std::memory_order_relaxed);
    std::call_once(same_device_logged_, [] {
      LOG(WARNING) << "ranks share a GPU: their AllGather copies are same-device copies, which the driver runs on "
                      "SMs/CUs (not DMA engines) when issued from dmagatherd; they time-slice with the ranks' "
                      "kernels. Counted as fallback 'same_device_copy_on_sm'. Run one rank per GPU to avoid it.";
    });
  }
  if (pushes != 0) pushes_.fetch_add(pushes, std::memory_order_relaxed);
}

absl::Status GpuEngine::Route(EngineOp* op) {
  std::fill(involved_.begin(), involved_.end(), 0);
  uint64_t same = 0, pushes = 0;
  absl::Status st;
  const int n = static_cast<int>(op->ranks.size());
  for (CopyCmd& c : op->plan.copies) {
    const int dd = c.dst_rank < n && op->ranks[c.dst_rank] != nullptr ? AsGpu(op->ranks[c.dst_rank])->device() : -1;
    const int sd = c.src_rank < n && op->ranks[c.src_rank] != nullptr ? AsGpu(op->ranks[c.src_rank])->device() : -1;
    if (dd < 0 || dd >= num_devices_) {
      st = absl::InternalError(
          absl::StrCat("rank ", c.dst_rank, " has no ", runtime_->label(), " device known to the engine"));
      break;
    }
    c.src_device = sd;
    c.dst_device = dd;
    const int on = IssuingDevice(sd, dd);
    if (on < 0) {
      st = common::FallbackError(absl::StrCat("rank ", c.src_rank, " (device ", sd, ") and rank ", c.dst_rank,
                                              " (device ", dd, ") are on GPUs that reach each other neither way (",
                                              peers_.why(dd, sd),
                                              "), so no copy engine can move "
                                              "bytes between them"));
      break;
    }
    involved_[on] = 1;
    if (sd == dd) {
      ++same;
    } else if (on != dd) {
      ++pushes;
    }
  }
  CountRouting(same, pushes);
  return st;
}

int GpuEngine::ChooseFinisher(const OpTrack* t) {
  const EngineOp& op = *t->op;
  if (!op.gpu_done || !runtime_->device_writes()) return -1;
  int first = 0;
  while (first < num_devices_ && !involved_[first]) ++first;
  bool flags = true;
  for (const EngineRank* r : op.ranks) flags &= r == nullptr || AsGpu(r)->done_flag() != 0;
  if (!flags || first >= num_devices_) return -1;
  return loads_.Finisher(t->load, first);
}

void GpuEngine::Issue(EngineOp* op) {
  const uint64_t t_start = clock_.NowNs();
  // Route: every copy's devices, and the device that issues it.
  const absl::Status st = Route(op);
  // Track the op (back-pressure if completions lag); the caller holds one
  // share of it, and each issuing device one, until its copies are
  // enqueued (then its completion holds it).
  OpTrack* t = TakeTrack();
  t->op = op;
  // Issued ahead of its ready flags under the bound: counted until it ends.
  t->waits_ahead = options_.max_waits_ahead > 0 && runtime_->device_waits() && !RanksReady(*op);
  t->load = loads_.Begin(op->job_id, t->waits_ahead);
  t->issue_order = 0;
  {
    absl::MutexLock lock(&t->mu);
    t->status = st;
  }
  t->open.store(1, std::memory_order_relaxed);
  t->ends.assign(num_devices_, nullptr);
  t->finisher = st.ok() ? ChooseFinisher(t) : -1;
  if (st.ok()) {
    int shares = 0;
    for (int d = 0; d < num_devices_; ++d) shares += involved_[d] ? 1 : 0;
    t->open.fetch_add(shares, std::memory_order_relaxed);
    t->unenqueued.store(shares, std::memory_order_relaxed);
    t->issue_order = ++next_issue_order_;
    for (int i = 0; i < num_devices_; ++i) {
      // One thread issuing every share issues the finisher's last (it waits
      // for the others to be enqueued).
      const int d = t->finisher < 0 ? i : (t->finisher + 1 + i) % num_devices_;
      if (involved_[d]) PostShare(devices_[d], t);
    }
  }
  execute_ns_.Record(clock_.NowNs() - t_start);
  CloseShare(t, absl::OkStatus());  // The caller's own share: may complete the op here.
}

void GpuEngine::PostShare(Device& dev, OpTrack* t) {
  if (!parallel_issue_) {
    IssueShare(dev, t);
    return;
  }
  dev.issuer->Post(t);
}

void GpuEngine::IssueShare(Device& dev, OpTrack* t) {
  const EngineOp& op = *t->op;
  dev.copies.clear();
  for (const CopyCmd& c : op.plan.copies) {
    if (IssuingDevice(c.src_device, c.dst_device) == dev.ordinal) dev.copies.push_back(c);
  }
  GpuEvent end = nullptr;
  absl::Status st;
  WaitForEarlierOps(t);
  if (abandon_.load(std::memory_order_relaxed)) {
    st = absl::UnavailableError("dmagatherd stopped before the op's copies were issued");
  } else {
    st = EnqueueDevice(dev, t, &end);
    if (st.ok()) {
      uint64_t bytes = 0;
      for (const CopyCmd& c : dev.copies) bytes += c.bytes;
      issued_bytes_[dev.ordinal].fetch_add(bytes, std::memory_order_relaxed);
    }
  }
  t->ends[dev.ordinal] = end;  // Before the share counts as enqueued (WriteDone reads it).
  if (!st.ok()) {
    {
      absl::MutexLock lock(&t->mu);  // The finisher must see it failed before it counts as enqueued.
      t->status.Update(st);
    }
    if (!t->issue_failed.exchange(true)) JobLoads::FailedAtIssue(t->load);
  }
  ShareEnqueued(t);
  if (end == nullptr && dev.lane != nullptr && dev.lane->job == op.job_id && !st.ok()) {
    // Something may be queued on the lane with no end to see it done: it
    // is never handed to another job.
    dev.lane->open.fetch_add(1, std::memory_order_acq_rel);
  }
  if (end != nullptr) {
    t->open.fetch_add(1, std::memory_order_acq_rel);
    dev.lane->open.fetch_add(1, std::memory_order_acq_rel);
    completions_[dev.ordinal]->shares.Post(Share{t, end, dev.lane});
  }
  CloseShare(t, st);
}

void GpuEngine::IssuerLoop(int device) {
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  pthread_setname_np(pthread_self(), ("dmag-issue-" + std::to_string(device)).c_str());
  runtime_->BindThread(device);
  Device& dev = devices_[device];
  Handoff<OpTrack*>& q = *dev.issuer;
  while (q.Wait()) {  // Until stopped with nothing left.
    IssueShare(dev, q.Front());
    q.Pop();  // Pending until issued: Stop's drain waits for the issue itself.
  }
}

}  // namespace dmagather::server::engines::gpu

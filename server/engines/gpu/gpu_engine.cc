// GpuEngine (gpu_engine.h): start-up (devices, peers, the objects of the
// per-op path and their threads), Execute and the routing step (Issue),
// stop, stats and the ring's staging.
#include "server/engines/gpu/gpu_engine.h"

#include <glog/logging.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/futex.h"
#include "common/status.h"
#include "server/engines/gpu/gpu_rank.h"

namespace dmagather::server::engines::gpu {

absl::StatusOr<std::unique_ptr<GpuEngine>> GpuEngine::Create(std::unique_ptr<GpuRuntime> runtime,
                                                             const Options& options) {
  if (runtime == nullptr) return absl::InvalidArgumentError("no GPU runtime");
  if (options.streams_per_device < 0 || options.streams_per_device > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("streams per device must be 1..64 (0: automatic), got ", options.streams_per_device));
  }
  if (options.chunk_bytes != 0 && options.chunk_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("chunk bytes must be >= 4096, got ", options.chunk_bytes));
  }
  if (runtime->num_devices() < 1) return absl::UnavailableError(absl::StrCat("no ", runtime->label(), " device"));
  auto engine = std::unique_ptr<GpuEngine>(new GpuEngine(std::move(runtime), options));
  DMAG_RETURN_IF_ERROR(engine->Init());
  return engine;
}

GpuEngine::GpuEngine(std::unique_ptr<GpuRuntime> runtime, const Options& options)
    : runtime_(std::move(runtime)),
      order_(std::make_shared<DeviceOrder>(runtime_->num_devices(), runtime_)),
      options_(options),
      clock_(options.clock != nullptr ? *options.clock : common::RealClock()),
      num_devices_(runtime_->num_devices()),
      streams_per_device_(options.streams_per_device > 0 ? options.streams_per_device
                                                         : std::min(64, std::max(4, num_devices_ - 1))),
      parallel_issue_(options.parallel_issue && num_devices_ > 1),
      chunk_bytes_(std::min(options.chunk_bytes != 0 ? options.chunk_bytes : runtime_->default_chunk_bytes(),
                            runtime_->max_transfer_bytes())),
      imports_(runtime_, order_),
      lockstep_(clock_, abandon_),
      in_flight_(kInFlight, clock_) {}

absl::Status GpuEngine::Init() {
  GpuRuntime& rt = *runtime_;
  watch_ = std::make_unique<IssueWatch>(num_devices_, clock_, [](const EngineRank* r) {
    const GpuRank* g = AsGpu(r);
    return IssueWatch::Words{g->ready_word(), g->done_word()};
  });
  DeviceWorker::Shared shared;
  shared.runtime = &rt;
  shared.order = order_.get();
  shared.peers = &peers_;  // Filled below, before the workers start.
  shared.lockstep = &lockstep_;
  shared.ops = &in_flight_;
  shared.watch = watch_.get();
  shared.figures = &figures_;
  shared.clock = &clock_;
  shared.abandon = &abandon_;
  shared.chunk_bytes = chunk_bytes_;
  shared.streams = streams_per_device_;
  shared.max_batch = options_.max_batch;
  shared.awake_ns = awake_ns();
  for (int d = 0; d < num_devices_; ++d) {
    workers_.push_back(std::make_unique<DeviceWorker>(shared, d));
    DMAG_RETURN_IF_ERROR(workers_.back()->Init());
  }
  imports_.Identify();
  peers_ = ProbePeers();
  rt.UsePeers(peers_);
  router_ = std::make_unique<Router>(peers_, rt.label());
  watch_->StartThread();
  LOG(INFO) << name() << " engine: " << num_devices_ << " device(s), " << streams_per_device_
            << " streams each, chunks of " << chunk_bytes_ << " bytes (cap " << rt.max_transfer_bytes() << "), "
            << options_.max_batch << " chunks per copy call, ready flags waited on "
            << (!rt.device_waits() ? std::string("the CPU")
                : options_.max_waits_ahead <= 0
                    ? std::string("the device")
                    : absl::StrCat("the device (at most ", options_.max_waits_ahead, " ops ahead, then the CPU)"))
            << ", " << (parallel_issue_ ? "one issuing thread per device" : "one issuing thread") << ", threads awake "
            << awake_ns() / 1000 << " us after their last work; " << rt.Describe();
  // As the completion threads: a burst of ops costs the issuers no wake-up.
  for (auto& w : workers_) w->Start(parallel_issue_);
  if (!rt.device_waits() || options_.max_waits_ahead > 0) {
    OpIssuer& issuer = *this;  // The step after the gate (ready_gate.h).
    gate_ = std::make_unique<ReadyGate>(clock_, awake_ns(), kGateSlots, issuer);
    gate_->Start();
  }
  return absl::OkStatus();
}

PeerTable GpuEngine::ProbePeers() {
  GpuRuntime& rt = *runtime_;
  // Peer access and a probe copy per ordered pair. An error is the pair's
  // alone: it is marked unreachable, and copies between the two take the
  // route the table leaves (IssuingDevice) or fail with the reason.
  PeerTable peers(num_devices_);
  std::vector<std::string> missing;
  for (int a = 0; a < num_devices_; ++a) {
    for (int b = 0; b < num_devices_; ++b) {
      if (a == b) continue;
      std::string why;
      const std::string& bus = imports_.identity(a).pci_bus_id;
      if (!bus.empty() && absl::EqualsIgnoreCase(bus, imports_.identity(b).pci_bus_id)) {
        why = "partitions (MIG) of one GPU, which have no peer access or IPC between them";
      } else if (absl::StatusOr<bool> ok = rt.EnablePeerAccess(a, b); !ok.ok()) {
        why = std::string(ok.status().message());
      } else if (!*ok) {
        why = "the driver reports no peer access";
      } else if (absl::Status probe = rt.ProbePeerCopy(a, b); !probe.ok()) {
        why = absl::StrCat("the probe copy failed: ", probe.message());
      }
      peers.Set(a, b, why.empty(), why);
      if (!why.empty()) missing.push_back(absl::StrCat(a, "->", b, " (", why, ")"));
    }
  }
  if (num_devices_ > 1) {
    if (missing.empty()) {
      LOG(INFO) << "peer access: every device reaches every other directly (" << num_devices_ * (num_devices_ - 1)
                << " pairs probed)";
    } else {
      LOG(WARNING) << "peer access: " << missing.size() << " of " << num_devices_ * (num_devices_ - 1)
                   << " device pairs cannot reach each other directly: " << absl::StrJoin(missing, "; ")
                   << ". A copy between such a pair is issued on the side that reaches the other; with "
                      "neither, its op is a FALLBACK";
    }
  }
  return peers;
}

GpuEngine::~GpuEngine() { Stop(); }

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

// With device waits: any op while fewer than max_waits_ahead are in flight;
// beyond that only an op whose flags are met, and only while no wait is
// parked (nothing it could queue behind). docs/CUDA.md, "Locks and waits".
bool GpuEngine::MayIssue(const EngineOp& op) {
  if (!runtime_->device_waits()) return RanksReady(op);
  return loads_.MayIssue(op.job_id, RanksReady(op), options_.max_waits_ahead);
}

void GpuEngine::Issue(EngineOp* op) {
  const uint64_t t_start = clock_.NowNs();
  const absl::Status st = router_->Route(op);
  // Track the op (back-pressure if completions lag); the router holds one
  // share of it, and each issuing device one, until its copies are
  // enqueued (then its completion holds it).
  InFlightOp* t = in_flight_.Take();
  // Issued ahead of its ready flags under the bound: counted until it ends.
  const bool waits_ahead = options_.max_waits_ahead > 0 && runtime_->device_waits() && !RanksReady(*op);
  t->Begin(op, loads_.Begin(op->job_id, waits_ahead), waits_ahead, st, num_devices_);
  if (st.ok()) {
    const std::vector<char>& involved = router_->involved();
    const int finisher = t->ChooseFinisher(involved, runtime_->device_writes(), loads_);
    t->OpenShares(router_->shares(), lockstep_.Next());
    for (int i = 0; i < num_devices_; ++i) {
      // One thread issuing every share issues the finisher's last (it waits
      // for the others to be enqueued).
      const int d = finisher < 0 ? i : (finisher + 1 + i) % num_devices_;
      if (involved[d]) workers_[d]->Post(t);
    }
  }
  execute_ns_.Record(clock_.NowNs() - t_start);
  in_flight_.Close(t, absl::OkStatus());  // The router's own share: may end the op here.
}

void GpuEngine::LogFigures() {
  if (execute_ns_.Summary().count == 0) return;
  auto us = [](const common::LatencyHistogram& h) {
    common::LatencySummaryNs x = h.Summary();
    return absl::StrCat("p50 ", x.p50 / 1e3, " us, p99 ", x.p99 / 1e3, " us");
  };
  // With parallel issue the op's thread only routes the copies and hands
  // each device its share; the issuing itself is in the per-device figures.
  LOG(INFO) << name() << " engine: " << execute_ns_.Summary().count << " ops; "
            << (parallel_issue_ ? "route and hand-off " : "issue ") << us(execute_ns_) << "; ready waits (per device) "
            << us(figures_.memops_ns) << " (" << figures_.ready_seen.load(std::memory_order_relaxed)
            << " skipped: flags already seen; " << held_ahead_.load(std::memory_order_relaxed)
            << " ops held on the CPU by the waits-ahead bound); done flags written by a GPU for "
            << figures_.done_written.load(std::memory_order_relaxed) << " ops; engine threads woken " << wakeups()
            << " times"
            << "; copy calls (per device) " << us(figures_.copies_ns)
            << "; completion: last share seen -> OnEngineDone done " << us(in_flight_.complete_ns()) << "; copy path "
            << runtime_->Describe();
}

void GpuEngine::Drain() {
  const uint64_t deadline = clock_.NowNs() + options_.stop_drain_ms * 1'000'000ull;
  auto drained = [&](auto&& empty) {
    while (!empty()) {
      if (clock_.NowNs() > deadline) {
        abandon_.store(true);
        if (gate_ != nullptr) gate_->Abandon();
        return;
      }
      usleep(1000);
    }
  };
  if (gate_ != nullptr) drained([&] { return gate_->Empty(); });
  for (auto& w : workers_) {
    if (abandon_.load()) break;
    drained([&] { return w->IssuePending() == 0; });
  }
  for (auto& w : workers_) {
    if (abandon_.load()) break;
    drained([&] { return w->CompletionPending() == 0; });
  }
}

void GpuEngine::Stop() {
  if (stopped_.exchange(true)) return;
  LogFigures();
  Drain();
  if (gate_ != nullptr) gate_->Stop();
  for (auto& w : workers_) w->StopIssuing();
  for (auto& w : workers_) w->StopCompletion();
}

uint64_t GpuEngine::wakeups() const {
  uint64_t n = gate_ != nullptr ? gate_->wakeups() : 0;
  for (const auto& w : workers_) n += w->wakeups();
  return n;
}

bool GpuEngine::ThreadsAsleep() {
  if (gate_ != nullptr && !gate_->asleep()) return false;
  for (auto& w : workers_) {
    if (!w->asleep()) return false;
  }
  return true;
}

EngineStats GpuEngine::stats() const {
  EngineStats s;
  s.ops = ops_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.chunks = figures_.chunks.load(std::memory_order_relaxed);
  s.same_device_copies = router_ != nullptr ? router_->same_device_copies() : 0;
  s.thread_wakeups = wakeups();
  s.held_on_cpu = held_ahead_.load(std::memory_order_relaxed);
  s.copy_engines = runtime_->CopyEngineCounters();
  if (s.copy_engines.empty()) {
    // The runtime picks the engine: bytes per issuing GPU (engine -1).
    for (const auto& w : workers_) {
      const uint64_t b = w->issued_bytes();
      if (b != 0) s.copy_engines.push_back(CopyEngineBytes{w->device(), -1, b});
    }
  }
  return s;
}

absl::Status GpuEngine::StageOut(void* host, const char* src, uint64_t bytes, const EngineRank* rank) {
  return runtime_->CopySync(AsGpu(rank)->device(), host, src, bytes);
}

absl::Status GpuEngine::WaitRankReady(const EngineRank* rank, uint32_t seq, const std::atomic<bool>& cancel) {
  // The ready flag the rank's stream writes (cuStreamWriteValue32) into its
  // completion block, read from the CPU as the CPU gate does.
  const uint32_t* w = AsGpu(rank)->ready_word();
  common::Backoff backoff;
  while (static_cast<int32_t>(__atomic_load_n(w, __ATOMIC_ACQUIRE) - seq) < 0) {
    if (cancel.load(std::memory_order_acquire)) return absl::CancelledError("the ring stopped");
    if (backoff.Pause()) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      backoff.Reset();
    }
  }
  return absl::OkStatus();
}

absl::Status GpuEngine::StageIn(char* dst, const void* host, uint64_t bytes, const EngineRank* rank) {
  return runtime_->CopySync(AsGpu(rank)->device(), dst, host, bytes);
}

}  // namespace dmagather::server::engines::gpu

// GpuEngine: the CopyEngine for GPUs, written once over a GpuRuntime
// (runtime.h): --backend=cuda runs it over the CUDA runtime (cuda/: NVIDIA
// copy engines), --backend=hip over HIP (hip/: AMD SDMA engines), the unit
// tests over the fake runtime on the CPU. The daemon launches no kernel,
// ever: its streams carry only copies, events and stream memory operations.
//
// An op, through the headers, one step each:
//   Execute (here)          counts the op; an op with no copies is done at once;
//   the gate (ready_gate.h) holds it on the CPU while it may not be issued
//                           (its ranks' ready flags not seen where the runtime
//                           cannot wait for them on the device, or its job over
//                           the max_waits_ahead bound, job_loads.h); the gate
//                           calls the engine back only through OpIssuer;
//   Issue (here, OpIssuer)  routes it (router.h: each copy to the device that
//                           issues it, FALLBACK where no device reaches both
//                           ends), tracks it (in_flight_pool.h: an InFlightOp
//                           with one share per issuing device and the finisher,
//                           in_flight_op.h), gives it its place in the
//                           cross-device order (lockstep.h) and posts each
//                           share to its device;
//   the device (device_worker.h) issues its share on the job's lane: ready
//                           waits, copies in chunks and waves, the finisher's
//                           done write, an end event; its completion thread
//                           (share_completion.h) sees the end;
//   the op's end (in_flight_pool.h) the last share closed: OnEngineDone (the
//                           scheduler's Job::FinishOp), then the job's load.
// Ranks and their memory come in apart from that path (rank_imports.h:
// device identities, AttachRank, the import cache).
//
// Done on the device (EngineOp::gpu_done, runtimes with device_writes()):
// one device of the job, the finisher, waits on its stream for every other
// device's share of the op and writes every rank's done flag; the ranks'
// streams go on with no CPU in between (docs/CUDA.md, "Completion").
//
// Threads: Import/AttachRank on gRPC threads; Execute on the ingress
// thread, which routes the op and posts each device's share (to the
// device's issuing thread with parallel issue, else issuing it itself);
// for an op the gate held, the gate thread does the same under the gate's
// lock (the issue lock: the two take turns and keep the order); the rest
// on each device's issuing and completion threads. Stop and the stats on
// the daemon's threads.
//
// Locks: the engine owns no mutex of its own; the objects it owns take
// theirs in the order lock_order.h declares (the issue lock first, the
// device-order locks around driver calls that touch several devices, the
// FIFOs and pools last). Deadlock freedom (docs/CUDA.md, "Locks and
// waits"): every driver call that touches several devices' memory holds
// their device-order locks (device_order.h), taken in index order; no
// device enqueues op n before every device has enqueued op n - 1
// (lockstep.h); while an op of a job with ready waits ahead of its flags is
// in flight, at most max_waits_ahead ops of that job are (job_loads.h); and
// every job has its own streams on each device (lanes.h), its own place in
// the CPU gate, and completion that waits for no other job's share.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/latency_histogram.h"
#include "server/engines/copy_engine.h"
#include "server/engines/gpu/device_order.h"
#include "server/engines/gpu/device_worker.h"
#include "server/engines/gpu/in_flight_pool.h"
#include "server/engines/gpu/issue_watch.h"
#include "server/engines/gpu/job_loads.h"
#include "server/engines/gpu/lockstep.h"
#include "server/engines/gpu/peer_table.h"
#include "server/engines/gpu/rank_imports.h"
#include "server/engines/gpu/ready_gate.h"
#include "server/engines/gpu/router.h"
#include "server/engines/gpu/runtime.h"

namespace dmagather::server::engines::gpu {

class GpuEngine : public CopyEngine, private OpIssuer {
 public:
  struct Options {
    // 0: max(4, devices - 1), so that a device can pull from every peer at
    // once. A value to tune on the machine (--streams).
    int streams_per_device = 0;
    uint64_t chunk_bytes = 0;       // 0: the runtime's default. Capped at its max_transfer_bytes().
    int max_batch = 16;             // Chunks per runtime Copy call.
    uint64_t stop_drain_ms = 5000;  // Stop waits this long for queued work, then fails it.
    // One issuing thread per device (engines with several devices). Off:
    // the ingress thread issues every device's share in turn.
    bool parallel_issue = true;
    // Runtimes with device waits: while any op issued ahead of its ranks'
    // ready flags (its device waits parked on a stream) is in flight, at
    // most this many ops are in flight in all; the next ones wait on the CPU
    // in the gate until their flags are seen, or the count falls. So the
    // commands queued behind a parked wait stay a few ops' worth, far from
    // a full stream queue, and no driver call blocks on one (docs/CUDA.md,
    // "Locks and waits"). 0: no bound (tests only: it can deadlock).
    int max_waits_ahead = 2;
    // The issuing, gate and completion threads keep polling this long after
    // their last work before they sleep (at least kCompletionSpinNs), so
    // that while a job is active an op costs no wake-up (--stay_awake_us).
    uint64_t stay_awake_ns = 0;
    // Every time the engine reads (polling back-off, the stop's drain, the
    // issue watch, its latency figures). Null: common::RealClock().
    common::Clock* clock = nullptr;
  };
  static absl::StatusOr<std::unique_ptr<GpuEngine>> Create(std::unique_ptr<GpuRuntime> runtime, const Options& options);
  ~GpuEngine() override;

  const char* name() const override { return runtime_->name(); }
  absl::StatusOr<std::shared_ptr<ImportedRegion>> Import(const RegionSpec& spec) override {
    return imports_.Import(spec);
  }
  void Execute(EngineOp* op) override;
  void Stop() override;
  EngineStats stats() const override;
  // Engine threads woken from sleep to take work (issuers, completion, gate).
  uint64_t wakeups() const;
  // Every engine thread (issuers, completion, gate) sleeps for want of work
  // (tests: an op posted now finds them asleep).
  bool ThreadsAsleep();
  absl::StatusOr<void*> AllocStaging(uint64_t bytes) override { return runtime_->AllocPinned(bytes); }
  void FreeStaging(void* host) override { runtime_->FreePinned(host); }
  absl::Status StageOut(void* host, const char* src, uint64_t bytes, const EngineRank* rank) override;
  absl::Status StageIn(char* dst, const void* host, uint64_t bytes, const EngineRank* rank) override;
  absl::Status WaitRankReady(const EngineRank* rank, uint32_t seq, const std::atomic<bool>& cancel) override;
  int worker_threads() const override { return streams_per_device_ * num_devices_; }
  bool writes_done() const override { return runtime_->device_writes(); }
  absl::StatusOr<std::unique_ptr<EngineRank>> AttachRank(const RankAttach& attach) override {
    return imports_.AttachRank(attach);
  }

  int num_devices() const { return num_devices_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  int streams_per_device() const { return streams_per_device_; }
  bool parallel_issue() const { return parallel_issue_; }
  GpuRuntime& runtime() const { return *runtime_; }
  const PeerTable& peers() const { return peers_; }
  const DeviceIdentity& identity(int device) const { return imports_.identity(device); }
  // The device that issues a copy from memory of `src` into memory of
  // `dst` (PeerTable::IssuingDevice), or -1 when neither reaches the other.
  int IssuingDevice(int src, int dst) const { return peers_.IssuingDevice(src, dst); }

 private:
  static constexpr uint64_t kCompletionSpinNs = 200'000;
  static constexpr size_t kInFlight = 4096;
  static constexpr size_t kGateSlots = 4096;

  GpuEngine(std::unique_ptr<GpuRuntime> runtime, const Options& options);
  absl::Status Init();
  // Peer access and a probe copy per ordered pair of devices, logged.
  PeerTable ProbePeers();
  // How long the engine's threads poll after their last work before they
  // sleep: Options::stay_awake_ns, at least kCompletionSpinNs.
  uint64_t awake_ns() const { return std::max(kCompletionSpinNs, options_.stay_awake_ns); }
  // Gives gated and queued work stop_drain_ms to finish; after that, the
  // engine abandons it (it fails).
  void Drain();
  void LogFigures();

  // OpIssuer (ready_gate.h), under the gate's lock (or on the ingress
  // thread where there is no gate). MayIssue: the op's ranks are ready, or
  // device waits may take it (below the max_waits_ahead bound).
  bool MayIssue(const EngineOp& op) override;
  // Routes the op, tracks it and posts each issuing device its share.
  void Issue(EngineOp* op) override;
  void Fail(EngineOp* op, const absl::Status& status) override { op->OnEngineDone(status); }

  // Shared with the imported regions and ranks, which may outlive the engine.
  const std::shared_ptr<GpuRuntime> runtime_;
  const std::shared_ptr<DeviceOrder> order_;
  const Options options_;
  common::Clock& clock_;
  const int num_devices_;
  const int streams_per_device_;
  const bool parallel_issue_;
  const uint64_t chunk_bytes_;
  std::atomic<bool> abandon_{false};  // Stop gave up waiting for the GPU.
  std::atomic<bool> stopped_{false};

  RankImports imports_;
  PeerTable peers_;                 // Set by Init, then read-only.
  std::unique_ptr<Router> router_;  // Set by Init.
  JobLoads loads_;
  Lockstep lockstep_;
  InFlightPool in_flight_;
  std::unique_ptr<IssueWatch> watch_;  // Set by Init, before any issue.
  DeviceWorker::Figures figures_;
  std::vector<std::unique_ptr<DeviceWorker>> workers_;  // Per device.
  // CPU gating (runtimes without device waits, or ops over the
  // max_waits_ahead bound); null with device waits and no bound.
  std::unique_ptr<ReadyGate> gate_;

  std::atomic<uint64_t> ops_{0}, bytes_{0};
  std::atomic<uint64_t> held_ahead_{0};  // Ops the max_waits_ahead bound held on the CPU.
  common::LatencyHistogram execute_ns_;  // Execute/Issue: route and hand-off (or issue).
};

}  // namespace dmagather::server::engines::gpu

// GpuEngine: the CopyEngine for GPUs, written once over a GpuRuntime
// (runtime.h): --backend=cuda runs it over the CUDA runtime (NVIDIA copy
// engines), --backend=hip over HIP (AMD SDMA engines), the unit tests over
// the fake runtime on the CPU.
//
// Devices. A rank names its GPU by identity (UUID, else PCI bus id) as well
// as by its own ordinal, which depends on what its process sees (one
// visible GPU per rank is the usual launch): AttachRank maps the identity
// to the daemon's device and refuses one the daemon does not see. At start
// every pair of devices gets peer access and a probe copy; the result is
// the PeerTable (peer_table.h). Each copy is issued on the device that
// owns its destination when that device reaches the source (a pull), else
// on the source's device when it reaches the destination (a push); a copy
// between two devices that reach each other neither way fails its op with
// FALLBACK and the reason, before anything of the op is issued.
//
// Rank buffers come in once as IPC handles (Import, cached by handle, so an
// allocation is opened once however often it is registered). Each device
// has its own streams and, with several devices, its own issuing thread:
// an op's share on each device is issued by that device's thread, all at
// once, instead of one thread walking the devices in turn. For every op,
// per issuing device: the op is gated on every rank's ready flag having
// reached the op's sequence number - on the device (stream 0 waits, cuda:
// cuStreamBatchMemOp) when the runtime can, else on the CPU before anything
// is issued (hip) -, the other streams join stream 0 through an event, the
// copies - cut into chunks of at most the runtime's transfer cap and into
// waves by PlanWaves, one stream per peer link when the share reads several
// peers - go out spread over the streams, the streams join back into stream
// 0 and an event marks the end. The daemon launches no kernel, ever: its
// streams carry only copies, events and stream memory operations.
//
// Done on the device (EngineOp::gpu_done, runtimes with device_writes()):
// one device of the job, the finisher, waits on its stream for every other
// device's share of the op and writes every rank's done flag; the ranks'
// streams go on with no CPU in between (docs/CUDA.md, "Completion").
//
// Completion: each device has its own completion thread, handed the
// device's enqueued shares (handoff.h), which polls every share it holds -
// so a share parked on its job's ready flags delays no other. An op spread
// over several devices is tracked by an OpTrack from a fixed pool; the
// thread that sees its last share end calls OnEngineDone, and the scheduler
// ends the op (Job::FinishOp: error records, and the done flags where no
// device wrote them), in order per rank. A failed share fails the op (every
// rank gets the error); later ops proceed.
//
// Same-device copies (ranks sharing one GPU) cannot use a copy engine from
// a second process: the driver runs them on SMs/CUs. They are counted
// (EngineStats::same_device_copies) and logged once.
//
// Threads: Import/AttachRank on gRPC threads (import_mu_); Execute on the
// ingress thread, which routes the op and hands each device's share to the
// device's issuing thread (or issues it itself when the engine has one
// device or parallel_issue is off); for an op whose ranks are not all ready
// yet (CPU gating, or over max_waits_ahead) the gate thread does the same
// (ready_gate.h: the gate's lock makes the two take turns and keeps the
// order); OnEngineDone on a device's completion
// thread (or where the op was issued when nothing was enqueued). The
// annotations below say which mutex guards what (clang checks them).
//
// Deadlock freedom (docs/CUDA.md, "Locks and waits"; gpu_engine_order.cc):
// every driver call that touches several devices' memory holds their
// device-order locks (device_order.h), taken in index order; no device
// enqueues op n before every device has enqueued op n - 1; while an op of a
// job with ready waits ahead of its flags is in flight, at most
// max_waits_ahead ops of that job are (job_loads.h); and every job has its
// own streams on each device (lanes.h), its own place in the CPU gate, and
// completion that waits for no other job's share.
#pragma once

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>  // std::once_flag
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/latency_histogram.h"
#include "server/engines/copy_engine.h"
#include "server/engines/gpu/device_order.h"
#include "server/engines/gpu/handoff.h"
#include "server/engines/gpu/issue_watch.h"
#include "server/engines/gpu/job_loads.h"
#include "server/engines/gpu/lanes.h"
#include "server/engines/gpu/peer_table.h"
#include "server/engines/gpu/ready_gate.h"
#include "server/engines/gpu/runtime.h"
#include "server/engines/gpu/wave_plan.h"

namespace dmagather::server::engines::gpu {

class GpuEngine : public CopyEngine {
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
  absl::StatusOr<std::shared_ptr<ImportedRegion>> Import(const RegionSpec& spec) override
      ABSL_LOCKS_EXCLUDED(import_mu_);
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
  absl::StatusOr<std::unique_ptr<EngineRank>> AttachRank(const RankAttach& attach) override;

  int num_devices() const { return num_devices_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  int streams_per_device() const { return streams_per_device_; }
  bool parallel_issue() const { return parallel_issue_; }
  GpuRuntime& runtime() const { return *runtime_; }
  const PeerTable& peers() const { return peers_; }
  const DeviceIdentity& identity(int device) const { return identities_[device]; }
  // The device that issues a copy from memory of `src` into memory of
  // `dst` (the rule at the top), or -1 when neither reaches the other.
  int IssuingDevice(int src, int dst) const;

 private:
  using JobLoad = JobLoads::Load;
  // One op in flight on the engine: how many device shares (plus the
  // issuer's own guard) are still open, and the first error.
  struct OpTrack {
    EngineOp* op = nullptr;
    JobLoad* load = nullptr;
    bool waits_ahead = false;  // Counted in its job's load until the op completes.
    uint64_t issue_order = 0;  // 1, 2, ... in Issue's order; 0: no share to issue.
    // The device that writes the ranks' done flags after every share's
    // copies (-1: the CPU publishes them), and each device's end event,
    // set before its share counts as enqueued.
    int finisher = -1;
    std::vector<GpuEvent> ends;
    std::atomic<bool> issue_failed{false};  // Counted in its load's unsettled_errors.
    std::atomic<int> unenqueued{0};         // Shares not enqueued yet.
    std::atomic<int> open{0};
    absl::Mutex mu;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  using Lane = LaneSet::Lane;
  struct Device {
    int ordinal = 0;
    // Each job's streams on this device (lanes.h: touched by whoever issues
    // this device's shares; a lane's `open` by its completion thread too).
    std::unique_ptr<LaneSet> lanes;
    Lane* lane = nullptr;  // The lane of the share being issued.
    // Issuing scratch, used only by whoever issues this device's shares
    // (its issuer thread, or the one thread that issues every device).
    std::vector<CopyCmd> copies;  // This device's copies of the op.
    std::vector<CopyCmd> chunks;
    std::vector<WaveBatch> batches;
    std::vector<uint64_t> flags;
    std::vector<char> stream_used;
    // Its issuing thread and the shares handed to it (null without parallel issue).
    std::unique_ptr<Handoff<OpTrack*>> issuer;
    std::thread issuer_thread;
  };
  // One device's share of an op: done when `end` has completed.
  struct Share {
    OpTrack* track = nullptr;
    GpuEvent end = nullptr;
    Lane* lane = nullptr;
  };
  // A device's shares enqueued on the GPU and the thread that completes
  // them (it polls every share it holds: a share parked on its job's flags
  // delays no other).
  struct Completion {
    Completion(common::Clock& clock, uint64_t spin_ns) : shares(kShareSlots, clock, spin_ns) {}
    Handoff<Share> shares;
    std::thread thread;
  };
  static constexpr uint64_t kCompletionSpinNs = 200'000;
  // How long the engine's threads poll after their last work before they
  // sleep: Options::stay_awake_ns, at least kCompletionSpinNs.
  uint64_t awake_ns() const { return std::max(kCompletionSpinNs, options_.stay_awake_ns); }
  static constexpr size_t kShareSlots = 4096;
  static constexpr size_t kTracks = 4096;
  static constexpr size_t kGateSlots = 4096;
  static constexpr size_t kIssueSlots = 4096;
  static constexpr size_t kLanesKept = 16;

  GpuEngine(std::unique_ptr<GpuRuntime> runtime, const Options& options);
  absl::Status Init();
  // Identities of the devices and the peer table (with probes), logged.
  absl::Status MapDevices();
  // The daemon's device for a rank's DeviceRef (by uuid, else bus id, else
  // the rank's ordinal when it sent no identity).
  absl::StatusOr<int> DaemonDevice(const DeviceRef& ref) const;
  // Routes the op (fills every copy's devices) and hands each issuing
  // device its share.
  void Issue(EngineOp* op);
  // Fills every copy's devices and involved_ (the issuing devices).
  absl::Status Route(EngineOp* op);
  // The device that writes the op's done flags (-1: the CPU publishes).
  int ChooseFinisher(const OpTrack* t);
  // Hands `dev` its share of the op (its issuer, or issues it here).
  void PostShare(Device& dev, OpTrack* t);
  // Counts an op's same-device copies (logged once) and pushes.
  void CountRouting(uint64_t same, uint64_t pushes);
  // Issues `dev`'s share of the op behind `t` and posts it for completion;
  // closes the share the caller opened for it.
  void IssueShare(Device& dev, OpTrack* t);
  // The cross-device order: a share of op n starts only once every share
  // of op n - 1 is enqueued, on every device.
  void WaitForEarlierOps(const OpTrack* t);
  void ShareEnqueued(OpTrack* t);
  // runtime_->Copy under the device-order locks of what it touches.
  absl::Status CopyInOrder(Device& dev, GpuStream stream, const CopyCmd* chunks, size_t n, bool sole);
  // Enqueues one device's share of `op`; sets *end to the end event when
  // one was recorded (also after an error, so completion waits for what
  // was already enqueued).
  absl::Status EnqueueDevice(Device& dev, OpTrack* t, GpuEvent* end);
  // The finisher's part, on its stream 0 before its end event: wait for
  // every other device's share of the op, then write the ranks' done flags.
  absl::Status WriteDone(Device& dev, OpTrack* t);
  // Records the share's end event on the lane's stream 0 (*end: it).
  absl::Status EndShare(Device& dev, GpuEvent* end);
  absl::Status WaitReady(Device& dev, const EngineOp& op);
  void IssuerLoop(int device);
  // Every rank's ready flag has reached op.seq (read on the CPU).
  static bool RanksReady(const EngineOp& op);
  // The op may be issued now: its ranks are ready, or device waits may
  // take it (below the max_waits_ahead bound).
  bool MayIssue(const EngineOp& op);
  GpuEvent TakeEndEvent(Device& dev) ABSL_LOCKS_EXCLUDED(pool_mu_);
  OpTrack* TakeTrack() ABSL_LOCKS_EXCLUDED(tracks_mu_);
  // Records `st` (if an error) and closes one share of the track; the last
  // close completes the op.
  void CloseShare(OpTrack* t, const absl::Status& st) ABSL_LOCKS_EXCLUDED(tracks_mu_);
  void CompletionLoop(int device) ABSL_LOCKS_EXCLUDED(pool_mu_);

  // Shared with the imported regions and ranks, which may outlive the engine.
  const std::shared_ptr<GpuRuntime> runtime_;
  const std::shared_ptr<DeviceOrder> order_;
  const Options options_;
  common::Clock& clock_;
  const int num_devices_;
  const int streams_per_device_;
  const bool parallel_issue_;
  uint64_t chunk_bytes_;
  std::vector<Device> devices_;
  std::vector<DeviceIdentity> identities_;
  PeerTable peers_;

  // Routing scratch (Issue: the ingress or gate thread, under the gate's
  // lock; so not annotated: with device waits and no max_waits_ahead there
  // is no gate and Issue runs on the ingress thread alone).
  std::vector<char> involved_;
  uint64_t next_issue_order_ = 0;
  // The last op whose shares are all enqueued (issuing threads).
  std::atomic<uint64_t> enqueued_through_{0};

  // CPU gating (runtimes without device waits, or ops over the
  // max_waits_ahead bound); null with device waits and no bound.
  std::unique_ptr<ReadyGate> gate_;

  // Per device: its pool of end events (taken by the issuer, returned by
  // the completion thread).
  absl::Mutex pool_mu_;
  std::vector<std::vector<GpuEvent>> free_end_ ABSL_GUARDED_BY(pool_mu_);

  // Per-device completion FIFOs (index = device) and the OpTrack pool.
  std::vector<std::unique_ptr<Completion>> completions_;
  std::vector<OpTrack> tracks_;
  absl::Mutex tracks_mu_;
  absl::CondVar tracks_cv_;  // A track was freed.
  std::vector<OpTrack*> free_tracks_ ABSL_GUARDED_BY(tracks_mu_);
  std::atomic<bool> stopping_{false};
  std::atomic<bool> abandon_{false};  // Stop gave up waiting for the GPU.
  std::atomic<bool> stopped_{false};

  // The import cache: opened IPC handles, by handle bytes.
  absl::Mutex import_mu_;
  std::map<std::string, std::weak_ptr<ImportedRegion>> imports_ ABSL_GUARDED_BY(import_mu_);

  std::atomic<uint64_t> ops_{0}, bytes_{0}, chunks_stat_{0}, same_device_{0}, pushes_{0};
  // Bytes each device's streams were given to copy (which GPU ran each
  // copy), reported where the runtime does not count per engine itself.
  std::unique_ptr<std::atomic<uint64_t>[]> issued_bytes_;
  // Where the daemon hop goes (logged at Stop).
  common::LatencyHistogram execute_ns_, memops_ns_, copies_ns_, complete_ns_;
  std::atomic<uint64_t> ready_seen_{0};    // Device waits skipped: the CPU saw every flag at the op.
  std::atomic<uint64_t> done_written_{0};  // Ops whose done flags a device wrote.
  JobLoads loads_;                         // Its mutex is taken after the gate's.
  std::atomic<uint64_t> held_ahead_{0};    // Ops the max_waits_ahead bound held on the CPU.
  std::unique_ptr<IssueWatch> watch_;      // Set by Init, before any issue.
  std::once_flag same_device_logged_;
  mutable std::once_flag ordinal_trusted_logged_;
};

}  // namespace dmagather::server::engines::gpu

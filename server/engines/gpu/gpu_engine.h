// GpuEngine: the CopyEngine for GPUs, written once over a GpuRuntime
// (runtime.h): --backend=cuda runs it over the CUDA runtime (NVIDIA copy
// engines), --backend=hip over HIP (AMD SDMA engines), the unit tests over
// the fake runtime on the CPU.
//
// Rank buffers come in once as IPC handles (Import, cached by handle, so an
// allocation is opened once however often it is registered). Each device
// has its own set of streams. For every op, per destination device: the
// op is gated on every rank's ready flag having reached the op's sequence
// number - on the device (stream 0 waits, cuda: cuStreamBatchMemOp) when
// the runtime can, else on the CPU before anything is issued (hip) -, the
// other streams join stream 0 through an event, the copies - cut into
// chunks of at most the runtime's transfer cap and into waves by PlanWaves
// - go out spread over the streams, the streams join back into stream 0
// and an event marks the end. The daemon launches no kernel, ever: its
// streams carry only copies, events and stream memory operations.
//
// Completion: each device has its own FIFO of enqueued shares and its own
// completion thread, which polls the shares' end events in that device's
// submission order - so a slow op delays only the ops behind it on the same
// device. An op spread over several devices is tracked by an OpTrack from a
// fixed pool; the thread that sees its last share end calls OnEngineDone,
// and the scheduler then publishes the done flags from the CPU
// (Job::FinishOp), in order per rank. A failed share fails the op (every
// rank gets the error); later ops proceed.
//
// Same-device copies (ranks sharing one GPU) cannot use a copy engine from
// a second process: the driver runs them on SMs/CUs. They are counted
// (EngineStats::same_device_copies) and logged once.
//
// Threads: Import/AttachRank on gRPC threads (import_mu_); Execute on the
// ingress thread; the op's copies are issued there (device waits) or, for
// an op whose ranks are not all ready yet, by the gate thread (CPU gating;
// issue_mu_ makes the two take turns and keeps the order); OnEngineDone on a
// device's completion thread (or where the op was issued when nothing was
// enqueued).
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/latency_histogram.h"
#include "server/engines/copy_engine.h"
#include "server/engines/gpu/runtime.h"
#include "server/engines/gpu/wave_plan.h"

namespace dmagather::server::engines::gpu {

class GpuEngine : public CopyEngine {
 public:
  struct Options {
    int streams_per_device = 4;
    uint64_t chunk_bytes = 0;    // 0: the runtime's default. Capped at its max_transfer_bytes().
    int max_batch = 16;          // Chunks per runtime Copy call.
    uint64_t stop_drain_ms = 5000;  // Stop waits this long for queued work, then fails it.
  };
  static absl::StatusOr<std::unique_ptr<GpuEngine>> Create(std::unique_ptr<GpuRuntime> runtime,
                                                           const Options& options);
  ~GpuEngine() override;

  const char* name() const override { return runtime_->name(); }
  absl::StatusOr<std::shared_ptr<ImportedRegion>> Import(const RegionSpec& spec) override;
  void Execute(EngineOp* op) override;
  void Stop() override;
  EngineStats stats() const override;
  absl::StatusOr<void*> AllocStaging(uint64_t bytes) override { return runtime_->AllocPinned(bytes); }
  void FreeStaging(void* host) override { runtime_->FreePinned(host); }
  absl::Status StageOut(void* host, const char* src, uint64_t bytes, const EngineRank* rank) override;
  absl::Status StageIn(char* dst, const void* host, uint64_t bytes, const EngineRank* rank) override;
  absl::Status WaitRankReady(const EngineRank* rank, uint32_t seq, const std::atomic<bool>& cancel) override;
  int worker_threads() const override { return options_.streams_per_device * num_devices_; }
  absl::StatusOr<std::unique_ptr<EngineRank>> AttachRank(const RankAttach& attach) override;

  int num_devices() const { return num_devices_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  GpuRuntime& runtime() const { return *runtime_; }

 private:
  struct Device {
    int ordinal = 0;
    std::vector<GpuStream> streams;
    GpuEvent gate = nullptr;            // Recorded on streams[0] after the ready waits.
    std::vector<GpuEvent> joins;        // Per stream: its copies, joined into streams[0].
    std::vector<GpuEvent> free_end;     // Pool of end events (under pool_mu_).
    std::vector<CopyCmd> copies;        // Scratch: this device's copies of the op.
  };
  // One op in flight on the engine: how many device shares (plus the
  // issuer's own guard) are still open, and the first error.
  struct OpTrack {
    EngineOp* op = nullptr;
    std::atomic<int> open{0};
    std::mutex mu;
    absl::Status status;
  };
  // One device's share of an op: done when `end` has completed.
  struct Share {
    OpTrack* track = nullptr;
    GpuEvent end = nullptr;
  };
  // A device's FIFO of shares and the thread that completes them.
  struct Completion {
    std::mutex mu;
    std::condition_variable cv;        // Work arrived / stop.
    std::condition_variable space_cv;  // A slot was freed.
    std::vector<Share> ring;
    uint64_t head = 0, tail = 0;
    // The thread waits on `cv` (the issuer must notify: a futex call on the
    // hop) only after kCompletionSpinNs without work; until then it polls
    // `posted` (tail, published), yielding between polls, and the issuer
    // skips the notify.
    bool sleeping = false;
    std::atomic<uint64_t> posted{0};
    std::thread thread;
  };
  static constexpr uint64_t kCompletionSpinNs = 200'000;
  static constexpr size_t kShareSlots = 4096;
  static constexpr size_t kTracks = 4096;
  static constexpr size_t kGateSlots = 4096;

  GpuEngine(std::unique_ptr<GpuRuntime> runtime, const Options& options);
  absl::Status Init();
  // Splits the op by destination device and enqueues every share.
  void Issue(EngineOp* op);
  // Enqueues one device's share of `op`; sets *end to the end event when
  // one was recorded (also after an error, so completion waits for what
  // was already enqueued).
  absl::Status EnqueueDevice(Device& dev, const EngineOp& op, GpuEvent* end);
  absl::Status WaitReady(Device& dev, const EngineOp& op);
  // Every rank's ready flag has reached op.seq (read on the CPU).
  static bool RanksReady(const EngineOp& op);
  GpuEvent TakeEndEvent(Device& dev);
  OpTrack* TakeTrack();
  // Records `st` (if an error) and closes one share of the track; the last
  // close completes the op.
  void CloseShare(OpTrack* t, const absl::Status& st);
  void CompletionLoop(int device);
  void GateLoop();

  // Shared with the imported regions and ranks, which may outlive the engine.
  const std::shared_ptr<GpuRuntime> runtime_;
  const Options options_;
  const int num_devices_;
  uint64_t chunk_bytes_;
  std::vector<Device> devices_;

  // Issuing scratch (under issue_mu_ when the gate thread runs).
  std::mutex issue_mu_;
  std::vector<CopyCmd> chunks_;
  std::vector<WaveBatch> batches_;
  std::vector<uint64_t> flags_;
  std::vector<char> stream_used_;

  // CPU gating (runtimes without device waits): ops waiting for their
  // ranks' ready flags, in order (under issue_mu_).
  std::vector<EngineOp*> gate_ring_;
  uint64_t gate_head_ = 0, gate_tail_ = 0;
  std::condition_variable gate_cv_;
  std::thread gate_thread_;

  std::mutex pool_mu_;

  // Per-device completion FIFOs (index = device) and the OpTrack pool.
  std::vector<std::unique_ptr<Completion>> completions_;
  std::vector<OpTrack> tracks_;
  std::mutex tracks_mu_;
  std::condition_variable tracks_cv_;
  std::vector<OpTrack*> free_tracks_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> abandon_{false};  // Stop gave up waiting for the GPU.
  std::atomic<bool> stopped_{false};

  // The import cache: opened IPC handles, by handle bytes.
  std::mutex import_mu_;
  std::map<std::string, std::weak_ptr<ImportedRegion>> imports_;

  std::atomic<uint64_t> ops_{0}, bytes_{0}, chunks_stat_{0}, same_device_{0};
  // Where the daemon hop goes (logged at Stop).
  common::LatencyHistogram execute_ns_, memops_ns_, copies_ns_, complete_ns_;
  std::atomic<uint64_t> ready_seen_{0};  // Device waits skipped: the CPU saw every flag at the op.
  std::once_flag same_device_logged_;
};

}  // namespace dmagather::server::engines::gpu

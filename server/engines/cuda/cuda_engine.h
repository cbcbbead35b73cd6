// The cuda CopyEngine: AllGather copies on the GPUs' DMA copy engines.
//
// Rank buffers come in once as CUDA IPC handles (Import, cached by handle,
// so an allocation is opened once however often it is registered). Each
// device has its own set of non-blocking streams. For every op, per
// destination device: stream 0 waits (cuStreamBatchMemOp, on the GPU) until
// every rank's ready flag has reached the op's sequence number, the other
// streams join it through an event, the copies - cut into chunks and waves
// by PlanWaves - go out as cudaMemcpyBatchAsync calls spread over the
// streams, the streams join back into stream 0 and an event marks the end.
// The daemon launches no kernel, ever: its streams carry only copies and
// stream memory operations.
//
// Completion: each device has its own FIFO of enqueued shares and its own
// completion thread, which polls the shares' end events (cudaEventQuery) in
// that device's submission order - so a slow op delays only the ops behind
// it on the same device. An op spread over several devices is tracked by an
// OpTrack from a fixed pool; the thread that sees its last share end calls
// OnEngineDone, and the scheduler then publishes the done flags from the
// CPU (Job::FinishOp), in order per rank; that write releases the ranks'
// cuStreamWaitValue32.
//
// Same-device copies (ranks sharing one GPU) cannot use a copy engine from
// a second process: the driver runs them on SMs. They are counted
// (EngineStats::same_device_copies) and logged once.
//
// Threads: Import/AttachRank on gRPC threads (import_mu_); Execute on the
// ingress thread (owns the scratch vectors and the per-device streams);
// OnEngineDone on a device's completion thread (or on the ingress thread
// when nothing was enqueued).
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

#include <cuda_runtime_api.h>

#include "common/cuda/cuda_api.h"
#include "common/latency_histogram.h"
#include "server/engines/copy_engine.h"
#include "server/engines/cuda/vmm_import.h"
#include "server/engines/cuda/wave_plan.h"

namespace dmagather::server::engines::cuda {

class CudaEngine : public CopyEngine {
 public:
  struct Options {
    int streams_per_device = 4;
    uint64_t chunk_bytes = 32 << 20;  // Capped at 64 MiB.
    int max_batch = 16;              // Chunks per cudaMemcpyBatchAsync.
    bool use_batch_api = true;       // false: one cudaMemcpyAsync per chunk.
  };
  // Fails (Unavailable) when there is no driver or no device.
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Create(const Options& options);
  ~CudaEngine() override;

  const char* name() const override { return "cuda"; }
  absl::StatusOr<std::shared_ptr<ImportedRegion>> Import(const RegionSpec& spec) override;
  void Execute(EngineOp* op) override;
  void Stop() override;
  EngineStats stats() const override;
  int worker_threads() const override { return options_.streams_per_device * num_devices_; }
  absl::StatusOr<std::unique_ptr<EngineRank>> AttachRank(const RankAttach& attach) override;

  int num_devices() const { return num_devices_; }

 private:
  struct Device {
    int ordinal = 0;
    std::vector<cudaStream_t> streams;
    cudaEvent_t gate = nullptr;         // Recorded on streams[0] after the ready waits.
    std::vector<cudaEvent_t> joins;     // Per stream: its copies, joined into streams[0].
    std::vector<cudaEvent_t> free_end;  // Pool of end events (under pool_mu_).
    std::vector<CopyCmd> copies;        // Scratch: this device's copies of the op.
  };
  // One op in flight on the engine: how many device shares (plus Execute's
  // own guard) are still open, and the first error.
  struct OpTrack {
    EngineOp* op = nullptr;
    std::atomic<int> open{0};
    std::mutex mu;
    absl::Status status;
  };
  // One device's share of an op: done when `end` has completed.
  struct Share {
    OpTrack* track = nullptr;
    cudaEvent_t end = nullptr;
  };
  // A device's FIFO of shares and the thread that completes them.
  struct Completion {
    std::mutex mu;
    std::condition_variable cv;        // Work arrived / stop.
    std::condition_variable space_cv;  // A slot was freed.
    std::vector<Share> ring;
    uint64_t head = 0, tail = 0;
    std::thread thread;
  };
  static constexpr size_t kShareSlots = 4096;
  static constexpr size_t kTracks = 4096;

  CudaEngine(const Options& options, const ::dmagather::common::cuda::DriverApi* api, int num_devices);
  absl::Status Init();
  // Enqueues one device's share of `op`; sets *end to the end event when
  // one was recorded (also after an error, so completion waits for what
  // was already enqueued).
  absl::Status EnqueueDevice(Device& dev, const EngineOp& op, cudaEvent_t* end);
  absl::Status WaitReady(Device& dev, const EngineOp& op);
  absl::Status IssueBatch(Device& dev, cudaStream_t stream, const CopyCmd* chunks, size_t n);
  cudaEvent_t TakeEndEvent(Device& dev);
  OpTrack* TakeTrack();
  // Records `st` (if an error) and closes one share of the track; the last
  // close completes the op.
  void CloseShare(OpTrack* t, const absl::Status& st);
  void CompletionLoop(int device);

  const Options options_;
  const ::dmagather::common::cuda::DriverApi* const api_;
  const int num_devices_;
  uint64_t chunk_bytes_;  // Options (or $DMAGATHER_CUDA_CHUNK_MIB), capped at 64 MiB.
  std::vector<Device> devices_;

  // Ingress-thread scratch.
  std::vector<CopyCmd> chunks_;
  std::vector<WaveBatch> batches_;
  std::vector<CUstreamBatchMemOpParams> memops_;
  std::vector<void*> dsts_, srcs_;
  std::vector<size_t> sizes_;
  std::vector<char> stream_used_;
  bool batch_memops_ok_ = true;
  bool batch_copies_ok_;

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

  std::mutex import_mu_;
  std::map<std::string, std::weak_ptr<ImportedRegion>> imports_;  // By IPC handle bytes.
  std::unique_ptr<VmmImporter> vmm_;  // "cuda_vmm" memory (vmm_import.h).

  std::atomic<uint64_t> ops_{0}, bytes_{0}, chunks_stat_{0}, same_device_{0};
  // Where the daemon hop goes (logged at Stop).
  common::LatencyHistogram execute_ns_, memops_ns_, copies_ns_, complete_ns_;
  std::once_flag same_device_logged_;
};

}  // namespace dmagather::server::engines::cuda

#include "server/engines/cuda/cuda_engine.h"

#include <glog/logging.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/cpu_relax.h"
#include "common/status.h"

namespace dmagather::server::engines::cuda {
namespace {

using ::dmagather::common::cuda::CudaStatus;
using ::dmagather::common::cuda::CuStatus;

constexpr uint64_t kMaxChunkBytes = uint64_t{64} << 20;

// A rank's allocation opened through CUDA IPC; closed with the last reference.
class CudaRegion : public ImportedRegion {
 public:
  CudaRegion(char* base, uint64_t bytes, int device) : base_(base), bytes_(bytes), device_(device) {}
  ~CudaRegion() override {
    cudaSetDevice(device_);
    cudaError_t err = cudaIpcCloseMemHandle(base_);
    if (err != cudaSuccess) LOG(WARNING) << CudaStatus("cudaIpcCloseMemHandle", err).message();
  }
  char* base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  char* const base_;
  const uint64_t bytes_;
  const int device_;
};

using common::CpuRelax;

// A rank on this engine: its device, and its completion block registered
// with CUDA (streams read the ready flag at `ready_flag`); unregistered when
// the rank is released.
class CudaRank : public EngineRank {
 public:
  CudaRank(int device, void* pages, uint64_t ready_flag) : device_(device), pages_(pages), ready_flag_(ready_flag) {}
  ~CudaRank() override {
    cudaError_t err = cudaHostUnregister(pages_);
    if (err != cudaSuccess && err != cudaErrorHostMemoryNotRegistered) {
      LOG(WARNING) << CudaStatus("cudaHostUnregister(completion flags)", err).message();
    }
    if (err != cudaSuccess) cudaGetLastError();
  }
  int device() const { return device_; }
  uint64_t ready_flag() const { return ready_flag_; }

 private:
  const int device_;
  void* const pages_;
  const uint64_t ready_flag_;
};

const CudaRank* AsCuda(const EngineRank* r) { return static_cast<const CudaRank*>(r); }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(const Options& options) {
  if (options.streams_per_device < 1 || options.streams_per_device > 64) {
    return absl::InvalidArgumentError(absl::StrCat("streams per device must be 1..64, got ",
                                                   options.streams_per_device));
  }
  if (options.chunk_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("chunk bytes must be >= 4096, got ", options.chunk_bytes));
  }
  DMAG_ASSIGN_OR_RETURN(int n, ::dmagather::common::cuda::CudaAvailable());
  DMAG_ASSIGN_OR_RETURN(const ::dmagather::common::cuda::DriverApi* api, ::dmagather::common::cuda::Driver());
  auto engine = std::unique_ptr<CudaEngine>(new CudaEngine(options, api, n));
  DMAG_RETURN_IF_ERROR(engine->Init());
  return engine;
}

CudaEngine::CudaEngine(const Options& options, const ::dmagather::common::cuda::DriverApi* api, int num_devices)
    : options_(options),
      api_(api),
      num_devices_(num_devices),
      chunk_bytes_(std::min(options.chunk_bytes, kMaxChunkBytes)),
      batch_copies_ok_(options.use_batch_api) {}

absl::Status CudaEngine::Init() {
  devices_.resize(num_devices_);
  const int ns = options_.streams_per_device;
  for (int d = 0; d < num_devices_; ++d) {
    Device& dev = devices_[d];
    dev.ordinal = d;
    DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(d));
    dev.streams.resize(ns);
    dev.joins.resize(ns);
    for (int s = 0; s < ns; ++s) {
      DMAG_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&dev.streams[s], cudaStreamNonBlocking));
      DMAG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&dev.joins[s], cudaEventDisableTiming));
    }
    DMAG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&dev.gate, cudaEventDisableTiming));
    for (int i = 0; i < 64; ++i) {
      cudaEvent_t e;
      DMAG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      dev.free_end.push_back(e);
    }
    dev.copies.reserve(64);
  }
  // Peer access between every pair of devices that allows it (NVLink/PCIe
  // peer copies stay on copy engines).
  for (int a = 0; a < num_devices_; ++a) {
    for (int b = 0; b < num_devices_; ++b) {
      if (a == b) continue;
      int can = 0;
      DMAG_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) {
        LOG(WARNING) << "device " << a << " cannot access device " << b << " as a peer; copies between them are staged by the driver";
        continue;
      }
      DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(a));
      cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else if (err != cudaSuccess) {
        return CudaStatus(absl::StrCat("cudaDeviceEnablePeerAccess(", a, "->", b, ")").c_str(), err);
      }
    }
  }
  std::vector<int> all_devices;
  for (int d = 0; d < num_devices_; ++d) all_devices.push_back(d);
  vmm_ = std::make_unique<VmmImporter>(api_, std::move(all_devices));
  stream_used_.resize(ns);
  tracks_ = std::vector<OpTrack>(kTracks);
  for (OpTrack& t : tracks_) free_tracks_.push_back(&t);
  const char* env = std::getenv("DMAGATHER_CUDA_BATCH");
  if (env != nullptr && std::strcmp(env, "0") == 0) batch_copies_ok_ = false;
  if (const char* c = std::getenv("DMAGATHER_CUDA_CHUNK_MIB"); c != nullptr && std::atoi(c) > 0) {
    chunk_bytes_ = std::min<uint64_t>(uint64_t(std::atoi(c)) << 20, kMaxChunkBytes);
  }
  LOG(INFO) << "cuda engine: " << num_devices_ << " device(s), " << ns << " streams each, chunks of "
            << chunk_bytes_ << " bytes, " << options_.max_batch
            << " chunks per batch, " << (batch_copies_ok_ ? "cudaMemcpyBatchAsync" : "cudaMemcpyAsync");
  for (int d = 0; d < num_devices_; ++d) {
    completions_.push_back(std::make_unique<Completion>());
    completions_.back()->ring.resize(kShareSlots);
  }
  for (int d = 0; d < num_devices_; ++d) completions_[d]->thread = std::thread([this, d] { CompletionLoop(d); });
  return absl::OkStatus();
}

CudaEngine::~CudaEngine() {
  Stop();
  for (Device& dev : devices_) {
    cudaSetDevice(dev.ordinal);
    for (cudaStream_t s : dev.streams) cudaStreamDestroy(s);
    for (cudaEvent_t e : dev.joins) cudaEventDestroy(e);
    for (cudaEvent_t e : dev.free_end) cudaEventDestroy(e);
    if (dev.gate != nullptr) cudaEventDestroy(dev.gate);
  }
}

absl::StatusOr<std::shared_ptr<ImportedRegion>> CudaEngine::Import(const RegionSpec& spec) {
  if (spec.kind == kMemoryCudaVmm) {
    if (spec.rank == nullptr) return absl::InvalidArgumentError("import without the owning rank");
    const int device = AsCuda(spec.rank)->device();
    DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    return vmm_->Import(spec, device);
  }
  if (spec.kind != kMemoryCudaIpc) {
    return common::FallbackError(absl::StrCat(
        "this dmagatherd runs the cuda backend, which imports device memory as CUDA IPC handles or VMM "
        "allocations; the client offered '", spec.kind, "' memory"));
  }
  if (spec.handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC handle has ", spec.handle.size(),
                                                   " bytes, expected ", sizeof(cudaIpcMemHandle_t)));
  }
  if (spec.rank == nullptr) return absl::InvalidArgumentError("import without the owning rank");
  const int device = AsCuda(spec.rank)->device();
  std::lock_guard<std::mutex> lock(import_mu_);
  auto it = imports_.find(spec.handle);
  if (it != imports_.end()) {
    if (auto region = it->second.lock(); region != nullptr && region->bytes() >= spec.bytes) return region;
  }
  for (auto i = imports_.begin(); i != imports_.end();) i = i->second.expired() ? imports_.erase(i) : std::next(i);
  DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, spec.handle.data(), sizeof(handle));
  void* p = nullptr;
  DMAG_CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess));
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = api_->cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS || size < spec.bytes) {
    cudaIpcCloseMemHandle(p);
    if (r != CUDA_SUCCESS) return CuStatus("cuMemGetAddressRange", r);
    return absl::InvalidArgumentError(absl::StrCat("the client registered ", spec.bytes,
                                                   " bytes but its CUDA allocation has only ", size));
  }
  auto region = std::make_shared<CudaRegion>(static_cast<char*>(p), spec.bytes, device);
  imports_[spec.handle] = region;
  return std::shared_ptr<ImportedRegion>(std::move(region));
}

absl::StatusOr<std::unique_ptr<EngineRank>> CudaEngine::AttachRank(const RankAttach& a) {
  if (a.device.kind != "cuda" || a.device.ordinal < 0) {
    return common::FallbackError(absl::StrCat(
        "this dmagatherd runs the cuda backend but the rank has no CUDA device (no GPU visible to it, or its "
        "libdmagather has no CUDA support)"));
  }
  if (a.device.ordinal >= num_devices_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the rank's CUDA device ", a.device.ordinal, " is not visible to dmagatherd, which sees ", num_devices_,
        " device(s): run the daemon and the ranks with the same CUDA_VISIBLE_DEVICES"));
  }
  cudaError_t err = cudaHostRegister(a.flag_pages, a.flag_bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (err == cudaErrorHostMemoryAlreadyRegistered) {
    cudaGetLastError();
  } else if (err != cudaSuccess) {
    return CudaStatus("cudaHostRegister(completion flags)", err);
  }
  void* dptr = nullptr;
  err = cudaHostGetDevicePointer(&dptr, const_cast<uint32_t*>(a.ready_word), 0);
  if (err != cudaSuccess) {
    cudaHostUnregister(a.flag_pages);
    return CudaStatus("cudaHostGetDevicePointer(ready flag)", err);
  }
  return std::unique_ptr<EngineRank>(new CudaRank(a.device.ordinal, a.flag_pages, reinterpret_cast<uint64_t>(dptr)));
}

cudaEvent_t CudaEngine::TakeEndEvent(Device& dev) {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!dev.free_end.empty()) {
      cudaEvent_t e = dev.free_end.back();
      dev.free_end.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) return nullptr;
  return e;
}

absl::Status CudaEngine::WaitReady(Device& dev, const EngineOp& op) {
  cudaStream_t s0 = dev.streams[0];
  memops_.clear();
  if (op.ready_observed) return absl::OkStatus();
  for (const EngineRank* r : op.ranks) {
    const uint64_t addr = r != nullptr ? AsCuda(r)->ready_flag() : 0;
    if (addr == 0) continue;
    CUstreamBatchMemOpParams p;
    std::memset(&p, 0, sizeof(p));
    p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    p.waitValue.address = static_cast<CUdeviceptr>(addr);
    p.waitValue.value = op.seq;
    p.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    memops_.push_back(p);
  }
  if (memops_.empty()) return absl::OkStatus();
  if (batch_memops_ok_) {
    CUresult r = api_->cuStreamBatchMemOp(reinterpret_cast<CUstream>(s0), static_cast<unsigned>(memops_.size()),
                                          memops_.data(), 0);
    if (r == CUDA_SUCCESS) return absl::OkStatus();
    LOG(WARNING) << CuStatus("cuStreamBatchMemOp", r).message() << "; using one cuStreamWaitValue32 per rank";
    batch_memops_ok_ = false;
  }
  for (const CUstreamBatchMemOpParams& p : memops_) {
    CUresult r = api_->cuStreamWaitValue32(reinterpret_cast<CUstream>(s0), p.waitValue.address,
                                           p.waitValue.value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) return CuStatus("cuStreamWaitValue32(ready flag)", r);
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::IssueBatch(Device& dev, cudaStream_t stream, const CopyCmd* chunks, size_t n) {
  if (batch_copies_ok_) {
    dsts_.clear();
    srcs_.clear();
    sizes_.clear();
    for (size_t i = 0; i < n; ++i) {
      dsts_.push_back(chunks[i].dst);
      srcs_.push_back(const_cast<char*>(chunks[i].src));
      sizes_.push_back(chunks[i].bytes);
    }
    cudaMemcpyAttributes attr;
    std::memset(&attr, 0, sizeof(attr));
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = cudaMemLocationTypeDevice;
    attr.srcLocHint.id = dev.ordinal;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    attr.dstLocHint.id = dev.ordinal;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_idx = 0;
    cudaError_t err = cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), n, &attr, &attr_idx, 1, stream);
    if (err == cudaSuccess) return absl::OkStatus();
    if (err != cudaErrorNotSupported && err != cudaErrorInvalidValue) return CudaStatus("cudaMemcpyBatchAsync", err);
    cudaGetLastError();
    LOG(WARNING) << CudaStatus("cudaMemcpyBatchAsync", err).message() << "; using cudaMemcpyAsync per chunk from now on";
    batch_copies_ok_ = false;
  }
  for (size_t i = 0; i < n; ++i) {
    DMAG_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(chunks[i].dst, chunks[i].src, chunks[i].bytes, cudaMemcpyDeviceToDevice, stream));
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::EnqueueDevice(Device& dev, const EngineOp& op, cudaEvent_t* end) {
  *end = nullptr;
  DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(dev.ordinal));
  WavePlanOptions wo;
  wo.chunk_bytes = chunk_bytes_;
  // Small ops stay on stream 0 (fewer calls = lower hop latency); a stream
  // is added per chunk_bytes of payload, up to streams_per_device.
  uint64_t dev_bytes = 0;
  for (const CopyCmd& c : dev.copies) dev_bytes += c.bytes;
  wo.streams = static_cast<int>(std::min<uint64_t>(options_.streams_per_device,
                                                   std::max<uint64_t>(1, dev_bytes / wo.chunk_bytes)));
  wo.max_batch = options_.max_batch;
  wo.world_size = static_cast<int>(op.ranks.size());
  PlanWaves(dev.copies, wo, &chunks_, &batches_);
  chunks_stat_.fetch_add(chunks_.size(), std::memory_order_relaxed);
  cudaStream_t s0 = dev.streams[0];
  const uint64_t t_plan = common::MonotonicNs();
  absl::Status st = WaitReady(dev, op);
  const uint64_t t_waits = common::MonotonicNs();
  memops_ns_.Record(t_waits - t_plan);
  if (st.ok()) {
    std::fill(stream_used_.begin(), stream_used_.end(), 0);
    for (const WaveBatch& b : batches_) stream_used_[b.stream] = 1;
    bool fan_out = false;
    for (size_t s = 1; s < stream_used_.size(); ++s) fan_out |= stream_used_[s] != 0;
    if (fan_out) {
      st.Update(CudaStatus("cudaEventRecord(gate)", cudaEventRecord(dev.gate, s0)));
      for (size_t s = 1; st.ok() && s < stream_used_.size(); ++s) {
        if (stream_used_[s]) st.Update(CudaStatus("cudaStreamWaitEvent(gate)", cudaStreamWaitEvent(dev.streams[s], dev.gate, 0)));
      }
    }
    const uint64_t t_copies = common::MonotonicNs();
    for (const WaveBatch& b : batches_) {
      if (!st.ok()) break;
      st.Update(IssueBatch(dev, dev.streams[b.stream], chunks_.data() + b.begin, b.end - b.begin));
    }
    copies_ns_.Record(common::MonotonicNs() - t_copies);
    // Join every stream back into stream 0 (also after an error: the end
    // event must follow everything that was enqueued).
    for (size_t s = 1; fan_out && s < stream_used_.size(); ++s) {
      if (!stream_used_[s]) continue;
      st.Update(CudaStatus("cudaEventRecord(join)", cudaEventRecord(dev.joins[s], dev.streams[s])));
      st.Update(CudaStatus("cudaStreamWaitEvent(join)", cudaStreamWaitEvent(s0, dev.joins[s], 0)));
    }
  }
  cudaEvent_t e = TakeEndEvent(dev);
  if (e == nullptr) {
    st.Update(absl::ResourceExhaustedError("cudaEventCreateWithFlags: no event for the end of an op"));
    return st;
  }
  cudaError_t err = cudaEventRecord(e, s0);
  if (err != cudaSuccess) {
    st.Update(CudaStatus("cudaEventRecord(end)", err));
    std::lock_guard<std::mutex> lock(pool_mu_);
    dev.free_end.push_back(e);
    return st;
  }
  *end = e;
  return st;
}

void CudaEngine::Execute(EngineOp* op) {
  const uint64_t t_start = common::MonotonicNs();
  ops_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(op->plan.bytes, std::memory_order_relaxed);
  if (op->plan.copies.empty()) {  // Nothing to move (one rank in place, or count 0).
    op->OnEngineDone(absl::OkStatus());
    return;
  }
  absl::Status st;
  for (Device& dev : devices_) dev.copies.clear();
  uint64_t same = 0;
  for (const CopyCmd& c : op->plan.copies) {
    const int n = static_cast<int>(op->ranks.size());
    const int dd = c.dst_rank < n && op->ranks[c.dst_rank] != nullptr ? AsCuda(op->ranks[c.dst_rank])->device() : -1;
    const int sd = c.src_rank < n && op->ranks[c.src_rank] != nullptr ? AsCuda(op->ranks[c.src_rank])->device() : -1;
    if (dd < 0 || dd >= num_devices_) {
      st = absl::InternalError(absl::StrCat("rank ", c.dst_rank, " has no CUDA device known to the engine"));
      break;
    }
    devices_[dd].copies.push_back(c);
    if (sd == dd) ++same;
  }
  if (same != 0) {
    same_device_.fetch_add(same, std::memory_order_relaxed);
    std::call_once(same_device_logged_, [] {
      LOG(WARNING) << "ranks share a GPU: their AllGather copies are same-device copies, which the driver runs on "
                      "SMs (not copy engines) when issued from dmagatherd; they time-slice with the ranks' "
                      "kernels. Counted as fallback 'same_device_copy_on_sm'. Run one rank per GPU to avoid it.";
    });
  }
  // Track the op (back-pressure if completions lag); Execute holds one
  // share of it until every device's share is enqueued.
  OpTrack* t = TakeTrack();
  t->op = op;
  t->status = st;
  t->open.store(1, std::memory_order_relaxed);
  if (st.ok()) {
    for (Device& dev : devices_) {
      if (dev.copies.empty()) continue;
      cudaEvent_t end = nullptr;
      absl::Status ds = EnqueueDevice(dev, *op, &end);
      if (end != nullptr) {
        Completion& c = *completions_[dev.ordinal];
        t->open.fetch_add(1, std::memory_order_acq_rel);
        {
          std::unique_lock<std::mutex> lock(c.mu);
          c.space_cv.wait(lock, [&] { return c.tail - c.head < kShareSlots; });
          c.ring[c.tail % kShareSlots] = Share{t, end};
          ++c.tail;
        }
        c.cv.notify_one();
      }
      if (!ds.ok()) {
        std::lock_guard<std::mutex> lock(t->mu);
        t->status.Update(ds);
        break;
      }
    }
  }
  execute_ns_.Record(common::MonotonicNs() - t_start);
  CloseShare(t, absl::OkStatus());  // Execute's own share: may complete the op here.
}

CudaEngine::OpTrack* CudaEngine::TakeTrack() {
  std::unique_lock<std::mutex> lock(tracks_mu_);
  tracks_cv_.wait(lock, [this] { return !free_tracks_.empty(); });
  OpTrack* t = free_tracks_.back();
  free_tracks_.pop_back();
  return t;
}

void CudaEngine::CloseShare(OpTrack* t, const absl::Status& st) {
  if (!st.ok()) {
    std::lock_guard<std::mutex> lock(t->mu);
    t->status.Update(st);
  }
  if (t->open.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  EngineOp* op = t->op;
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(t->mu);
    status = std::move(t->status);
    t->status = absl::OkStatus();
  }
  {
    std::lock_guard<std::mutex> lock(tracks_mu_);
    free_tracks_.push_back(t);
  }
  tracks_cv_.notify_one();
  const uint64_t t_seen = common::MonotonicNs();
  op->OnEngineDone(status);
  complete_ns_.Record(common::MonotonicNs() - t_seen);
}

void CudaEngine::CompletionLoop(int device) {
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // 1 us: short sleeps stay short.
  cudaSetDevice(device);
  Completion& c = *completions_[device];
  for (;;) {
    Share sh;
    {
      std::unique_lock<std::mutex> lock(c.mu);
      c.cv.wait(lock, [&] { return c.head != c.tail || stopping_.load(); });
      if (c.head == c.tail) return;  // Stopping and drained.
      sh = c.ring[c.head % kShareSlots];
    }
    absl::Status st;
    const uint64_t t0 = common::MonotonicNs();
    for (;;) {
      cudaError_t err = cudaEventQuery(sh.end);
      if (err == cudaSuccess) break;
      if (err != cudaErrorNotReady) {
        st = CudaStatus("cudaEventQuery(end of op)", err);
        break;
      }
      if (abandon_.load(std::memory_order_relaxed)) {
        st = absl::UnavailableError("dmagatherd stopped while the op's copies were still queued");
        break;
      }
      // Spin (latency: a sleep costs ~60 us of timer slack), yielding
      // after 200 us; sleep between polls only after 5 ms.
      const uint64_t waited = common::MonotonicNs() - t0;
      if (waited < 200'000) {
        for (int i = 0; i < 32; ++i) CpuRelax();
      } else if (waited < 5'000'000) {
        sched_yield();
      } else {
        usleep(50);
      }
    }
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      devices_[device].free_end.push_back(sh.end);
    }
    {
      std::lock_guard<std::mutex> lock(c.mu);
      ++c.head;
    }
    c.space_cv.notify_one();
    CloseShare(sh.track, st);
  }
}

void CudaEngine::Stop() {
  if (stopped_.exchange(true)) return;
  if (execute_ns_.Summary().count != 0) {
    auto us = [](const common::LatencyHistogram& h) {
      common::LatencySummaryNs x = h.Summary();
      return absl::StrCat("p50 ", x.p50 / 1e3, " us, p99 ", x.p99 / 1e3, " us");
    };
    LOG(INFO) << "cuda engine: " << execute_ns_.Summary().count << " ops; Execute " << us(execute_ns_)
              << "; ready waits (per device) " << us(memops_ns_) << "; copy calls (per device) " << us(copies_ns_)
              << "; completion: last share seen -> OnEngineDone done " << us(complete_ns_);
  }
  // Give queued copies 5 s to finish; after that, report them failed.
  const uint64_t deadline = common::MonotonicNs() + 5'000'000'000ull;
  for (auto& c : completions_) {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(c->mu);
        if (c->head == c->tail) break;
      }
      if (common::MonotonicNs() > deadline) {
        abandon_.store(true);
        break;
      }
      usleep(1000);
    }
  }
  stopping_.store(true);
  for (auto& c : completions_) {
    {
      std::lock_guard<std::mutex> lock(c->mu);
    }
    c->cv.notify_all();
    if (c->thread.joinable()) c->thread.join();
  }
}

EngineStats CudaEngine::stats() const {
  EngineStats s;
  s.ops = ops_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.chunks = chunks_stat_.load(std::memory_order_relaxed);
  s.same_device_copies = same_device_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace dmagather::server::engines::cuda

// ---------------------------------------------------------------------------
// Registration (server/engines/engine_registry.h): --backend=cuda, and the
// first choice of --backend=auto. Kept apart from the engine above.
#include "server/engines/engine_registry.h"
#include "server/engines/factory.h"

namespace dmagather::server::engines::cuda {
namespace {

EngineBackend CudaBackend() {
  EngineBackend b;
  b.name = "cuda";
  b.priority = 200;
  b.label = "CUDA";
  b.unusable = "no usable CUDA GPU";
  b.create = [](const EngineOptions& o) -> absl::StatusOr<std::unique_ptr<CopyEngine>> {
    CudaEngine::Options co;
    co.streams_per_device = o.streams_per_device;
    if (o.chunk_bytes != 0) co.chunk_bytes = o.chunk_bytes;
    DMAG_ASSIGN_OR_RETURN(std::unique_ptr<CudaEngine> engine, CudaEngine::Create(co));
    return std::unique_ptr<CopyEngine>(std::move(engine));
  };
  b.describe = [](const CopyEngine& e) {
    return absl::StrCat(static_cast<const CudaEngine&>(e).num_devices(), " CUDA GPU(s)");
  };
  return b;
}

const EngineRegistration kCudaRegistration(CudaBackend());

}  // namespace
}  // namespace dmagather::server::engines::cuda

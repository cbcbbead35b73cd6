// The cuda GpuRuntime: the GPU engine's calls on the CUDA runtime (linked
// statically) and the driver functions reached through entry points
// (common/cuda/cuda_api.h), so dmagatherd starts on machines without a
// driver. NVIDIA copy engines:
//  - ready waits on the device: one cuStreamBatchMemOp of
//    CU_STREAM_MEM_OP_WAIT_VALUE_32 per op and device (falls back to one
//    cuStreamWaitValue32 per rank if the driver refuses batches);
//  - copies: cudaMemcpyBatchAsync with cudaMemcpyFlagPreferOverlapWithCompute
//    (falls back to cudaMemcpyAsync per chunk if unsupported, or with
//    --cuda_batch=false), chunks of at most 64 MiB;
//  - one issuing state per device (the engine issues every device from its
//    own thread): scratch, the batch fallback and the copy graph cache;
//  - devices by identity (cudaDeviceProp.uuid, PCI bus id); peer access
//    per pair, then a probe: a copy issued on one device that reads the
//    other's memory, checked byte for byte (cudaMemcpy to and from pinned
//    host memory around it: no kernel);
//  - ready flags: one registration of the completion block serves every
//    device when each reports CanUseHostPointerForRegisteredMem; a device
//    that does not turns the device waits off (the engine gates on the CPU);
//  - copy graphs (--cuda_graphs=false turns them off): a copy call of
//    chunks up to --cuda_graph_max_kib (default 1024) seen a second
//    time (same device, addresses and sizes: ZeRO-3 gathers into the same
//    buffers every step) is built once into a CUDA graph of memcpy nodes in
//    a chain and replayed with one cudaGraphLaunch. Issuing 12 small copies
//    costs ~40 us as a batch and ~1.2 us as a replay
//    (bench/gpu/issue_cost.cc; docs/PERFORMANCE.md). A call of a known
//    shape at new addresses (FSDP2 allocates its unsharded parameters anew)
//    updates a graph of that shape in place (cuda_graphs.cc,
//    --cuda_graph_per_shape). Graphs hold addresses:
//    IPC closes and VMM unmaps report their range first and the graphs that
//    touch it are dropped (copy_graph_cache.h);
//  - imports: CUDA IPC handles of allocation bases (cudaIpcOpenMemHandle,
//    size checked with cuMemGetAddressRange);
//  - rank flags: cudaHostRegister(Mapped | Portable) of the completion block.
// CreateCudaRuntime (cuda_runtime.h) makes it; register.cc registers
// --backend=cuda with it.
//
// Threads: as runtime.h.
#include "server/engines/gpu/cuda/cuda_runtime.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/cuda/cuda_api.h"
#include "common/status.h"
#include "server/engines/gpu/cuda/copy_graph_cache.h"
#include "server/engines/gpu/cuda/cuda_graphs.h"
#include "server/engines/gpu/cuda/cuda_memops.h"
#include "server/engines/gpu/cuda/vmm_import.h"
#include "server/engines/gpu/runtime.h"

namespace dmagather::server::engines::gpu::cuda {
namespace {

using ::dmagather::common::cuda::CudaStatus;
using ::dmagather::common::cuda::CuStatus;
using ::dmagather::common::cuda::DriverApi;

class CudaRuntime : public GpuRuntime {
 public:
  // Fails (Unavailable) when there is no driver or no device.
  static absl::StatusOr<std::unique_ptr<GpuRuntime>> Create(const CudaEngineOptions& options) {
    DMAG_ASSIGN_OR_RETURN(int n, ::dmagather::common::cuda::CudaAvailable());
    DMAG_ASSIGN_OR_RETURN(const DriverApi* api, ::dmagather::common::cuda::Driver());
    return std::unique_ptr<GpuRuntime>(new CudaRuntime(api, n, options));
  }

  const char* name() const override { return "cuda"; }
  const char* label() const override { return "CUDA"; }
  const char* device_kind() const override { return "cuda"; }
  const char* ipc_memory_kind() const override { return common::kMemoryCudaIpc; }
  size_t ipc_handle_bytes() const override { return sizeof(cudaIpcMemHandle_t); }
  int num_devices() const override { return num_devices_; }
  uint64_t max_transfer_bytes() const override { return kCudaMaxTransferBytes; }
  uint64_t default_chunk_bytes() const override { return kCudaDefaultChunkBytes; }
  bool device_waits() const override { return device_waits_; }
  std::string Describe() const override {
    int batched = 0;
    std::vector<const CopyGraphCache*> caches;
    for (const auto& is : issuing_) {
      batched += is->batch_copies_ok ? 1 : 0;
      if (is->graphs != nullptr) caches.push_back(is->graphs.get());
    }
    std::string d = batched == num_devices_ ? "cudaMemcpyBatchAsync"
                    : batched == 0          ? "cudaMemcpyAsync"
                                            : absl::StrCat("cudaMemcpyBatchAsync on ", batched, " of ", num_devices_,
                                                           " devices, cudaMemcpyAsync on the others");
    if (!device_waits_) absl::StrAppend(&d, "; ", no_device_waits_why_);
    absl::StrAppend(&d, device_writes() ? "; done flags written by the GPU" : "; done flags published by the CPU");
    return absl::StrCat(d, "; ", DescribeCopyGraphs(caches), paths_.Describe());
  }

  // Ring staging: pinned host memory and synchronous host<->device copies
  // (copy engines; cudaMemcpy between pinned host memory and the device).
  absl::StatusOr<void*> AllocPinned(uint64_t bytes) override {
    void* p = nullptr;
    DMAG_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
    return p;
  }
  void FreePinned(void* host) override { cudaFreeHost(host); }
  // On a non-blocking stream of the calling (ring) thread, never the legacy
  // default stream: nothing here may wait behind the engine's streams, whose
  // ready waits can stand until the ranks' own streams move.
  absl::Status CopySync(int device, void* dst, const void* src, uint64_t bytes) override {
    struct ThreadStreams {
      std::map<int, cudaStream_t> by_device;
      ~ThreadStreams() {
        for (auto& [d, st] : by_device) {
          cudaSetDevice(d);
          cudaStreamDestroy(st);
        }
      }
    };
    thread_local ThreadStreams streams;
    DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    cudaStream_t& st = streams.by_device[device];
    if (st == nullptr) DMAG_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    DMAG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st));
    DMAG_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));
    return absl::OkStatus();
  }

  absl::Status SetDevice(int device) override {
    DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    return absl::OkStatus();
  }
  absl::StatusOr<DeviceIdentity> Identify(int device) override {
    cudaDeviceProp prop;
    DMAG_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
    DeviceIdentity id;
    id.uuid.assign(prop.uuid.bytes, sizeof(prop.uuid.bytes));
    id.name = prop.name;
    char bus[32] = {0};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) == cudaSuccess) {
      id.pci_bus_id = bus;
    } else {
      cudaGetLastError();
    }
    return id;
  }
  absl::StatusOr<bool> EnablePeerAccess(int a, int b) override {
    int can = 0;
    DMAG_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, a, b));
    if (!can) return false;
    DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(a));
    cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
    } else if (err != cudaSuccess) {
      cudaGetLastError();
      return CudaStatus(absl::StrCat("cudaDeviceEnablePeerAccess(", a, "->", b, ")").c_str(), err);
    }
    return true;
  }
  // 64 KiB of a pattern into `to`'s memory (from pinned host memory), copied
  // by a stream of `from` into `from`'s memory, read back and compared.
  absl::Status ProbePeerCopy(int from, int to) override {
    constexpr size_t kBytes = 64 << 10;
    void* host = nullptr;
    void* src = nullptr;
    void* dst = nullptr;
    cudaStream_t s = nullptr;
    absl::Status st;
    auto call = [&](const char* what, cudaError_t err) {
      if (st.ok() && err != cudaSuccess) {
        cudaGetLastError();
        st = CudaStatus(what, err);
      }
      return st.ok();
    };
    if (call("cudaHostAlloc", cudaHostAlloc(&host, 2 * kBytes, cudaHostAllocPortable))) {
      unsigned char* h = static_cast<unsigned char*>(host);
      for (size_t i = 0; i < kBytes; ++i) h[i] = static_cast<unsigned char>((i * 131 + from * 17 + to * 29) >> 3);
      std::memset(h + kBytes, 0, kBytes);
      call("cudaSetDevice", cudaSetDevice(to)) && call("cudaMalloc(probe source)", cudaMalloc(&src, kBytes)) &&
          call("cudaMemcpy(probe pattern in)", cudaMemcpy(src, h, kBytes, cudaMemcpyHostToDevice)) &&
          call("cudaSetDevice", cudaSetDevice(from)) &&
          call("cudaMalloc(probe destination)", cudaMalloc(&dst, kBytes)) &&
          call("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) &&
          call("cudaMemcpyAsync(peer probe)", cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice, s)) &&
          call("cudaStreamSynchronize(peer probe)", cudaStreamSynchronize(s)) &&
          call("cudaMemcpy(probe result out)", cudaMemcpy(h + kBytes, dst, kBytes, cudaMemcpyDeviceToHost));
      if (st.ok() && std::memcmp(h, h + kBytes, kBytes) != 0) {
        st = absl::DataLossError(absl::StrCat("the probe copy from device ", to, " to device ", from, " (issued on ",
                                              from, ") brought back different bytes"));
      }
    }
    if (s != nullptr) cudaStreamDestroy(s);
    if (dst != nullptr) cudaFree(dst);
    if (src != nullptr) cudaFree(src);
    if (host != nullptr) cudaFreeHost(host);
    return st;
  }
  void UsePeers(const PeerTable& peers) override { vmm_->SetPeers(peers); }
  absl::StatusOr<GpuStream> CreateStream(int device) override {
    DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    cudaStream_t s = nullptr;
    DMAG_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return static_cast<GpuStream>(s);
  }
  void DestroyStream(int device, GpuStream s) override {
    cudaSetDevice(device);
    cudaStreamDestroy(static_cast<cudaStream_t>(s));
  }
  absl::StatusOr<GpuEvent> CreateEvent(int device) override {
    DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    cudaEvent_t e = nullptr;
    DMAG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return static_cast<GpuEvent>(e);
  }
  void DestroyEvent(int device, GpuEvent e) override {
    cudaSetDevice(device);
    cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }

  absl::StatusOr<uint64_t> RegisterFlags(int device, void* pages, uint64_t bytes, const uint32_t* ready_word) override {
    DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    cudaError_t err = cudaHostRegister(pages, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (err == cudaErrorHostMemoryAlreadyRegistered) {
      cudaGetLastError();
    } else if (err != cudaSuccess) {
      return CudaStatus("cudaHostRegister(completion flags)", err);
    }
    void* dptr = nullptr;
    err = cudaHostGetDevicePointer(&dptr, const_cast<uint32_t*>(ready_word), 0);
    if (err != cudaSuccess) {
      cudaHostUnregister(pages);
      return CudaStatus("cudaHostGetDevicePointer(ready flag)", err);
    }
    return reinterpret_cast<uint64_t>(dptr);
  }
  void UnregisterFlags(void* pages) override {
    cudaError_t err = cudaHostUnregister(pages);
    if (err != cudaSuccess && err != cudaErrorHostMemoryNotRegistered) {
      LOG(WARNING) << CudaStatus("cudaHostUnregister(completion flags)", err).message();
    }
    if (err != cudaSuccess) cudaGetLastError();
  }

  // CUDA IPC.
  // "cuda_vmm": VMM chunks handed over as fds, mapped as one region.
  absl::StatusOr<std::shared_ptr<ImportedRegion>> ImportOther(const RegionSpec& spec, int device,
                                                              int rank_ordinal) override {
    if (spec.kind != common::kMemoryCudaVmm) return GpuRuntime::ImportOther(spec, device, rank_ordinal);
    DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    return vmm_->Import(spec, device, rank_ordinal);
  }

  absl::StatusOr<IpcMapping> OpenIpc(int device, const std::string& h) override {
    DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, h.data(), sizeof(handle));
    void* p = nullptr;
    DMAG_CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess));
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = api_->cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(p));
    if (r != CUDA_SUCCESS) {
      cudaIpcCloseMemHandle(p);
      return CuStatus("cuMemGetAddressRange", r);
    }
    return IpcMapping{static_cast<char*>(p), size};
  }
  void CloseIpc(int device, char* base) override {
    cudaSetDevice(device);
    if (!releases_.empty()) {  // Before the addresses can be reused.
      CUdeviceptr lo = 0;
      size_t size = 0;
      if (api_->cuMemGetAddressRange(&lo, &size, reinterpret_cast<CUdeviceptr>(base)) == CUDA_SUCCESS) {
        Released(lo, size);
      } else {
        Released(0, ~uint64_t{0});  // Unknown extent: drop every graph.
      }
    }
    cudaError_t err = cudaIpcCloseMemHandle(base);
    if (err != cudaSuccess) LOG(WARNING) << CudaStatus("cudaIpcCloseMemHandle", err).message();
  }

  absl::Status WaitValues(int device, GpuStream stream, const uint64_t* flags, size_t n, uint32_t value) override {
    return StreamMemOps(*api_, device, static_cast<CUstream>(stream), flags, n, value, /*write=*/false,
                        &issuing_[device]->memops, &issuing_[device]->batch_memops_ok);
  }
  bool device_writes() const override { return device_waits_ && done_on_device_; }
  absl::Status WriteValues(int device, GpuStream stream, const uint64_t* flags, size_t n, uint32_t value) override {
    return StreamMemOps(*api_, device, static_cast<CUstream>(stream), flags, n, value, /*write=*/true,
                        &issuing_[device]->memops, &issuing_[device]->batch_memops_ok);
  }

  absl::Status Copy(int device, GpuStream stream, const CopyCmd* chunks, size_t n, bool sole_stream) override {
    const uint64_t t0 = common::MonotonicNs();
    Issuing& is = *issuing_[device];
    absl::Status st;
    CopyGraphCache::Served path = CopyGraphCache::Served::kNot;
    if (is.graphs != nullptr && is.graphs->Replay(device, stream, chunks, n, sole_stream)) {
      path = is.graphs->last_served();
    } else {
      st = CopyWithoutGraph(device, static_cast<cudaStream_t>(stream), chunks, n);
    }
    paths_.Record(path, common::MonotonicNs() - t0, n);
    return st;
  }

  bool CopyTouchesOthers(int device) const override {
    const Issuing& is = *issuing_[device];
    return is.graphs != nullptr && is.graphs->releases()->pending();
  }

  // The copies without a graph: one batch call, or one call each.
  absl::Status CopyWithoutGraph(int device, cudaStream_t s, const CopyCmd* chunks, size_t n) {
    Issuing& is = *issuing_[device];
    if (is.batch_copies_ok) {
      is.dsts.clear();
      is.srcs.clear();
      is.sizes.clear();
      is.attrs.clear();
      is.attr_idx.clear();
      for (size_t i = 0; i < n; ++i) {
        is.dsts.push_back(chunks[i].dst);
        is.srcs.push_back(const_cast<char*>(chunks[i].src));
        is.sizes.push_back(chunks[i].bytes);
        // One attribute per run of chunks with the same ends' devices: the
        // location hints name where each end lives (-1: host memory).
        if (i == 0 || chunks[i].src_device != chunks[i - 1].src_device ||
            chunks[i].dst_device != chunks[i - 1].dst_device) {
          cudaMemcpyAttributes attr;
          std::memset(&attr, 0, sizeof(attr));
          attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
          SetLocation(&attr.srcLocHint, chunks[i].src_device);
          SetLocation(&attr.dstLocHint, chunks[i].dst_device);
          attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
          is.attrs.push_back(attr);
          is.attr_idx.push_back(i);
        }
      }
      cudaError_t err = ::dmagather::common::cuda::MemcpyBatchAsync(
          is.dsts.data(), is.srcs.data(), is.sizes.data(), n, is.attrs.data(), is.attr_idx.data(), is.attrs.size(), s);
      if (err == cudaSuccess) return absl::OkStatus();
      if (err != cudaErrorNotSupported && err != cudaErrorInvalidValue) {
        return CudaStatus("cudaMemcpyBatchAsync", err);
      }
      cudaGetLastError();
      LOG(WARNING) << "device " << device << ": " << CudaStatus("cudaMemcpyBatchAsync", err).message()
                   << "; using cudaMemcpyAsync per chunk on this device from now on";
      is.batch_copies_ok = false;
    }
    for (size_t i = 0; i < n; ++i) {
      DMAG_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(chunks[i].dst, chunks[i].src, chunks[i].bytes, cudaMemcpyDeviceToDevice, s));
    }
    return absl::OkStatus();
  }

  absl::Status RecordEvent(GpuEvent e, GpuStream s) override {
    return CudaStatus("cudaEventRecord", cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)));
  }
  absl::Status StreamWaitEvent(GpuStream s, GpuEvent e) override {
    return CudaStatus("cudaStreamWaitEvent",
                      cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0));
  }
  absl::StatusOr<bool> QueryEvent(GpuEvent e) override {
    cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(e));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    return CudaStatus("cudaEventQuery(end of op)", err);
  }

 private:
  CudaRuntime(const DriverApi* api, int n, const CudaEngineOptions& options)
      : api_(api), num_devices_(n), done_on_device_(options.done_on_device) {
    const bool batch = options.batch;
    const bool graphs = options.graphs;
    for (int d = 0; d < n; ++d) {
      auto is = std::make_unique<Issuing>();
      is->batch_copies_ok = batch;
      if (graphs) {
        is->graphs = std::make_unique<CopyGraphCache>(CudaGraphOps(), CudaGraphOptions(options));
        releases_.push_back(is->graphs->releases());
      }
      issuing_.push_back(std::move(is));
      // One registration of the ready flags serves every device's waits
      // only where each device reads registered memory at its host address.
      int host_ptr = 0;
      if (cudaDeviceGetAttribute(&host_ptr, cudaDevAttrCanUseHostPointerForRegisteredMem, d) != cudaSuccess) {
        cudaGetLastError();
        host_ptr = 0;
      }
      if (!host_ptr && device_waits_) {
        device_waits_ = false;
        no_device_waits_why_ = absl::StrCat("device ", d,
                                            " cannot use host pointers for registered memory, so the "
                                            "ready flags are read on the CPU");
        LOG(WARNING) << no_device_waits_why_;
      }
    }
    VmmImporter::ReleaseFn on_release;
    if (!releases_.empty()) {  // By value: a region may outlive the runtime.
      on_release = [logs = releases_](uint64_t base, uint64_t bytes) {
        for (const auto& r : logs) r->Add(base, bytes);
      };
    }
    vmm_ = std::make_unique<VmmImporter>(api, std::move(on_release));
  }
  // An import's range is about to go: every device's graphs that touch it go.
  void Released(uint64_t base, uint64_t bytes) {
    for (const auto& r : releases_) r->Add(base, bytes);
  }
  static void SetLocation(cudaMemLocation* loc, int device) {
    loc->type = device < 0 ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
    loc->id = device < 0 ? 0 : device;
  }
  // A device's issuing state: used only by that device's issuing thread.
  struct Issuing {
    std::vector<CUstreamBatchMemOpParams> memops;
    std::vector<void*> dsts, srcs;
    std::vector<size_t> sizes;
    std::vector<cudaMemcpyAttributes> attrs;
    std::vector<size_t> attr_idx;
    bool batch_memops_ok = true;
    bool batch_copies_ok = true;             // Off for good on this device after a refused batch.
    std::unique_ptr<CopyGraphCache> graphs;  // Null with --cuda_graphs=false.
  };

  const DriverApi* const api_;
  const int num_devices_;
  CopyPathFigures paths_;
  std::unique_ptr<VmmImporter> vmm_;               // "cuda_vmm" memory (vmm_import.h).
  std::vector<std::unique_ptr<Issuing>> issuing_;  // Per device.
  // Where import releases are reported: every device's graph cache.
  std::vector<std::shared_ptr<ReleaseLog>> releases_;
  bool device_waits_ = true;
  // --cuda_done_on_device=false: the CPU publishes every done flag (the
  // A/B of the handshake's cost; docs/CUDA.md, "Completion").
  const bool done_on_device_;
  std::string no_device_waits_why_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuRuntime>> CreateCudaRuntime(const CudaEngineOptions& options) {
  return CudaRuntime::Create(options);
}

}  // namespace dmagather::server::engines::gpu::cuda

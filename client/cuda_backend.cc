// The cuda client backend: the CUDA side of a rank when dmagatherd runs the
// cuda backend. Registers the rank's completion block with CUDA (so its
// streams can write ready_seq and wait on done_seq), describes device
// pointers (allocation base, size, buffer id, device) for the registration
// cache, exports IPC handles, and enqueues the stream operations of a
// submit: the out-of-place self-shard copies (one batch call that the
// driver runs on a copy engine beside this process's kernels), the ready
// write and the done wait. No host synchronisation anywhere.
//
// Threads: the rank's submitting thread (CommImpl's caller).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "abi/device_memory_v1.h"
#include "abi/graph_v1.h"
#include "absl/strings/str_format.h"
#include "client/backend.h"
#include "client/device_memory.h"
#include "client/vmm_walk.h"
#include "common/cuda/cuda_api.h"
#include "common/memory_kinds.h"
#include "common/status.h"
#include "kernels/reduce.h"

namespace dmagather::client {
namespace {

using ::dmagather::common::cuda::CudaStatus;
using ::dmagather::common::cuda::CuStatus;

int CurrentDevice() {
  if (!::dmagather::common::cuda::CudaAvailable().ok()) return -1;
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return d;
}

// The driver's view of VMM mappings, for WalkVmm / VmmCurrent.
class CudaVmmDriver : public VmmDriver {
 public:
  explicit CudaVmmDriver(const ::dmagather::common::cuda::DriverApi* api) : api_(api) {}
  absl::Status Mapping(uintptr_t addr, uintptr_t* base, uint64_t* size, uint64_t* id) const override {
    CUdeviceptr b = 0;
    size_t n = 0;
    CUresult r = api_->cuMemGetAddressRange(&b, &n, static_cast<CUdeviceptr>(addr));
    if (r != CUDA_SUCCESS) return absl::NotFoundError(CuStatus("cuMemGetAddressRange", r).message());
    unsigned long long buffer_id = 0;
    r = api_->cuPointerGetAttribute(&buffer_id, CU_POINTER_ATTRIBUTE_BUFFER_ID, static_cast<CUdeviceptr>(addr));
    if (r != CUDA_SUCCESS) return absl::NotFoundError(CuStatus("cuPointerGetAttribute(BUFFER_ID)", r).message());
    *base = static_cast<uintptr_t>(b);
    *size = n;
    *id = buffer_id;
    return absl::OkStatus();
  }
  absl::StatusOr<int> Export(uintptr_t base) const override {
    CUmemGenericAllocationHandle h = 0;
    CUresult r = api_->cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(base));
    if (r != CUDA_SUCCESS) {
      return common::FallbackError(absl::StrFormat(
          "%s: the memory at 0x%x is neither legacy-IPC memory nor a VMM allocation dmagather can export",
          CuStatus("cuMemRetainAllocationHandle", r).message(), base));
    }
    CUmemAllocationProp prop;
    std::memset(&prop, 0, sizeof(prop));
    r = api_->cuMemGetAllocationPropertiesFromHandle(&prop, h);
    if (r != CUDA_SUCCESS) {
      api_->cuMemRelease(h);
      return CuStatus("cuMemGetAllocationPropertiesFromHandle", r);
    }
    if ((prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
      api_->cuMemRelease(h);
      return common::FallbackError(absl::StrFormat(
          "the VMM allocation mapped at 0x%x was created without a shareable handle type (cuMemCreate with "
          "requestedHandleTypes = 0x%x, no CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), so no other process can "
          "map it",
          base, unsigned(prop.requestedHandleTypes)));
    }
    int fd = -1;
    r = api_->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    api_->cuMemRelease(h);
    if (r != CUDA_SUCCESS) {
      return common::FallbackError(absl::StrCat(CuStatus("cuMemExportToShareableHandle(POSIX fd)", r).message(),
                                                ": this VMM allocation cannot be shared with dmagatherd"));
    }
    return fd;
  }

 private:
  const ::dmagather::common::cuda::DriverApi* const api_;
};

// Frees a graph slot when the CUDA graph that captured it is destroyed
// (a user object the graph and its instances hold).
struct GraphSlotOwner {
  uint32_t slot;
  std::shared_ptr<GraphSlotsFreed> freed;
  static void CUDART_CB Destroy(void* p) {
    auto* o = static_cast<GraphSlotOwner*>(p);
    {
      // No CUDA call here (a CUDA callback thread): a store and a list.
      absl::MutexLock lock(&o->freed->mu);
      o->freed->freed.push_back(o->slot);
      if (o->freed->ready != nullptr) {
        __atomic_store_n(&o->freed->ready[o->slot], abi::kGraphSlotReleasedV1, __ATOMIC_RELEASE);
      }
    }
    delete o;
  }
};

// Allocations, frees and events are not stream work: made while a stream
// of this thread captures in global mode (a captured reduce-scatter's
// staging, its mark), they would invalidate the capture. Relaxed mode for
// their duration; they touch no capturing stream.
class RelaxedCapture {
 public:
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// The CUDA calls DeviceMemory (device_memory.h) is written over: pointer
// queries through the driver, IPC handles and allocations through the
// runtime.
class CudaMemory final : public DeviceMemoryApi {
 public:
  explicit CudaMemory(const ::dmagather::common::cuda::DriverApi* api) : api_(api) {}
  const char* backend() const override { return "cuda"; }
  const char* label() const override { return "CUDA"; }
  const char* malloc_name() const override { return "cudaMalloc"; }
  const char* ipc_memory_kind() const override { return common::kMemoryCudaIpc; }

  bool IsDeviceMemory(const void* ptr) const override {
    unsigned int type = 0;
    CUresult r = api_->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, Dptr(ptr));
    return r == CUDA_SUCCESS && type == CU_MEMORYTYPE_DEVICE;
  }
  absl::StatusOr<int> DeviceOrdinal(const void* ptr) const override {
    int ordinal = -1;
    CUresult r = api_->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, Dptr(ptr));
    if (r != CUDA_SUCCESS) return CuStatus("cuPointerGetAttribute(DEVICE_ORDINAL)", r);
    return ordinal;
  }
  absl::StatusOr<uint64_t> BufferIdOf(const void* ptr) const override {
    unsigned long long id = 0;
    CUresult r = api_->cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, Dptr(ptr));
    if (r != CUDA_SUCCESS) return CuStatus("cuPointerGetAttribute(BUFFER_ID)", r);
    return uint64_t{id};
  }
  absl::Status AddressRange(const void* ptr, uintptr_t* base, uint64_t* bytes) const override {
    CUdeviceptr b = 0;
    size_t size = 0;
    CUresult r = api_->cuMemGetAddressRange(&b, &size, Dptr(ptr));
    if (r != CUDA_SUCCESS) return CuStatus("cuMemGetAddressRange", r);
    *base = static_cast<uintptr_t>(b);
    *bytes = size;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> IpcHandle(uintptr_t base) const override {
    cudaIpcMemHandle_t h;
    cudaError_t err = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base));
    if (err != cudaSuccess) {
      cudaGetLastError();
      return CudaStatus("cudaIpcGetMemHandle", err);
    }
    return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
  }

  absl::Status SetDevice(int device) const override {
    DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    return absl::OkStatus();
  }
  absl::StatusOr<void*> Malloc(uint64_t bytes) const override {
    RelaxedCapture relaxed;
    void* p = nullptr;
    DMAG_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
    return p;
  }
  void Free(void* p) const override {
    RelaxedCapture relaxed;
    if (cudaFree(p) != cudaSuccess) cudaGetLastError();
  }

 private:
  static CUdeviceptr Dptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }
  const ::dmagather::common::cuda::DriverApi* const api_;
};

// A cudaEvent: where a staging half's last sum is, for the next user of
// the half (reduce_scatter.h). Never recorded: reached.
class EventMark : public StreamMark {
 public:
  static absl::StatusOr<std::unique_ptr<StreamMark>> Create() {
    RelaxedCapture relaxed;
    cudaEvent_t e = nullptr;
    DMAG_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return std::unique_ptr<StreamMark>(new EventMark(e));
  }
  ~EventMark() override {
    RelaxedCapture relaxed;
    cudaEventDestroy(event_);
  }
  absl::Status Record(void* stream) override {
    DMAG_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, static_cast<cudaStream_t>(stream)));
    return absl::OkStatus();
  }
  absl::Status WaitOn(void* stream) override {
    DMAG_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event_, 0));
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    DMAG_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Reached() override {
    const cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) return false;
    if (err != cudaSuccess) return CudaStatus("cudaEventQuery", err);
    return true;
  }

 private:
  explicit EventMark(cudaEvent_t e) : event_(e) {}
  cudaEvent_t event_;
};

class CudaBackend : public ClientBackend {
 public:
  static absl::StatusOr<std::unique_ptr<ClientBackend>> Create(const ClientBackendContext& ctx) {
    if (ctx.device < 0) {
      return common::FallbackError("dmagatherd runs the cuda backend but this process has no usable CUDA device");
    }
    DMAG_ASSIGN_OR_RETURN(const ::dmagather::common::cuda::DriverApi* api, ::dmagather::common::cuda::Driver());
    DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(ctx.device));
    abi::CompletionV1* block = ctx.completion;
    DMAG_CUDA_RETURN_IF_ERROR(
        cudaHostRegister(block, ctx.flag_bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    void* ready = nullptr;
    void* done = nullptr;
    void* graph = nullptr;
    cudaError_t err = cudaHostGetDevicePointer(&ready, &block->ready_seq, 0);
    if (err == cudaSuccess) err = cudaHostGetDevicePointer(&done, &block->done_seq, 0);
    if (err == cudaSuccess) err = cudaHostGetDevicePointer(&graph, abi::GraphFlagsOf(block), 0);
    if (err != cudaSuccess) {
      cudaHostUnregister(block);
      return CudaStatus("cudaHostGetDevicePointer(completion flags)", err);
    }
    return std::unique_ptr<ClientBackend>(new CudaBackend(api, ctx.device, block, reinterpret_cast<uint64_t>(ready),
                                                          reinterpret_cast<uint64_t>(done),
                                                          reinterpret_cast<uint64_t>(graph)));
  }
  ~CudaBackend() override {
    if (cudaHostUnregister(block_) != cudaSuccess) cudaGetLastError();
  }

  const char* name() const override { return "cuda"; }

  absl::StatusOr<std::unique_ptr<OwnedBuffer>> Allocate(uint64_t bytes) override {
    return AllocateDeviceBuffer(memory_, device_, bytes, [this](const void* p, uint64_t n) { return Describe(p, n); });
  }

  absl::Status PrepareThread() const override { return memory_->SetDevice(device_); }

  absl::StatusOr<MemoryExport> Describe(const void* ptr, uint64_t bytes) const override {
    DMAG_RETURN_IF_ERROR(CheckDeviceBuffer(*memory_, ptr, device_));
    int legacy_ipc = 1;
    CUresult r = api_->cuPointerGetAttribute(&legacy_ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                             reinterpret_cast<CUdeviceptr>(ptr));
    if (r == CUDA_SUCCESS && legacy_ipc == 0) return DescribeNonLegacy(ptr, bytes);
    return ExportIpcBuffer(*memory_, ptr, bytes);
  }

  // Memory legacy CUDA IPC cannot share: stream-ordered pools and VMM.
  absl::StatusOr<MemoryExport> DescribeNonLegacy(const void* ptr, uint64_t bytes) const {
    const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(ptr);
    void* pool = nullptr;
    if (api_->cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p) == CUDA_SUCCESS && pool != nullptr) {
      return common::FallbackError(absl::StrFormat(
          "%p is stream-ordered pool memory (cudaMallocAsync); dmagather cannot share pool memory with "
          "dmagatherd (the default pool is not exportable, and importing exportable pools is not built yet)",
          ptr));
    }
    auto walk = WalkVmm(vmm_, reinterpret_cast<uintptr_t>(ptr), bytes, /*export_fds=*/true);
    if (!walk.ok()) return walk.status();
    MemoryExport e;
    e.base = walk->base;
    e.bytes = walk->bytes;
    e.buffer_id = walk->chunks.front().id;
    e.memory_kind = common::kMemoryCudaVmm;
    std::vector<abi::VmmChunkV1> table;
    for (const VmmChunk& c : walk->chunks) table.push_back(abi::VmmChunkV1{c.offset, c.bytes, c.id});
    abi::VmmTableHeaderV1 h{};
    h.stamp = abi::kVmmTableStampV1;
    h.chunks = static_cast<uint32_t>(table.size());
    h.device = static_cast<uint32_t>(device_);
    e.handle.assign(reinterpret_cast<const char*>(&h), sizeof(h));
    e.handle.append(reinterpret_cast<const char*>(table.data()), table.size() * sizeof(abi::VmmChunkV1));
    e.chunks = std::move(walk->chunks);
    e.device_fds = std::make_shared<std::vector<common::UniqueFd>>(std::move(walk->fds));
    return e;
  }

  bool ChunksCurrent(uintptr_t base, const std::vector<VmmChunk>& chunks, const void* ptr,
                     uint64_t bytes) const override {
    return VmmCurrent(vmm_, base, chunks, reinterpret_cast<uintptr_t>(ptr), bytes);
  }

  uint64_t BufferId(const void* ptr) const override {
    unsigned long long id = 0;
    if (api_->cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, reinterpret_cast<CUdeviceptr>(ptr)) !=
        CUDA_SUCCESS) {
      return 0;
    }
    return id;
  }
  bool registers_on_submit() const override { return true; }

  absl::Status CheckStream(void*) const override { return absl::OkStatus(); }
  bool copies_own_shard() const override { return true; }
  absl::Status CopyOwnShards(const OwnShardCopy* copies, size_t n, void* stream, bool capturing) override {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    // A copy engine: the batch call with PreferOverlapWithCompute, which the
    // driver honours in a context that runs compute (this rank's; a bare
    // daemon's same-device copies stay on SMs). Not under capture (the batch
    // call cannot be captured: it fails and the capture goes on without the
    // copy) and not on the legacy default stream (refused).
    if (batch_copies_ && !capturing && s != nullptr && s != cudaStreamLegacy) {
      batch_.Clear();
      for (size_t i = 0; i < n; ++i) batch_.Add(copies[i].dst, copies[i].src, copies[i].bytes);
      cudaMemcpyAttributes attr;
      std::memset(&attr, 0, sizeof(attr));
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      size_t attr_idx = 0;
      cudaError_t err = ::dmagather::common::cuda::MemcpyBatchAsync(batch_.dsts.data(), batch_.srcs.data(),
                                                                    batch_.sizes.data(), n, &attr, &attr_idx, 1, s);
      if (err == cudaSuccess) return absl::OkStatus();
      if (err != cudaErrorNotSupported && err != cudaErrorInvalidValue) return CudaStatus("cudaMemcpyBatchAsync", err);
      cudaGetLastError();
      // Not supported: plain copies from now on. Invalid value (e.g. a send
      // in pageable host memory): plain copies for this op.
      if (err == cudaErrorNotSupported) {
        std::fprintf(stderr,
                     "dmagather: %s: this rank copies its own shards with cudaMemcpyAsync (on SMs) from now on\n",
                     CudaStatus("cudaMemcpyBatchAsync", err).ToString().c_str());
        batch_copies_ = false;
      }
    }
    for (size_t i = 0; i < n; ++i) {
      DMAG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copies[i].dst, copies[i].src, copies[i].bytes, cudaMemcpyDefault, s));
    }
    return absl::OkStatus();
  }
  absl::Status WriteReady(void* stream, uint32_t seq) override {
    return CuStatus("cuStreamWriteValue32(ready flag)",
                    api_->cuStreamWriteValue32(static_cast<CUstream>(stream), ready_dev_, seq, 0));
  }
  bool has_stream_waits() const override { return true; }
  absl::Status CanReduce() const override { return absl::OkStatus(); }
  absl::Status Reduce(const ReduceArgs& a, void* stream) override {
    const int err = kernels::ReduceChunks(a.chunks, a.n, a.count, a.dtype, a.redop, a.out, stream);
    if (err != 0) return CudaStatus("the reduce-scatter's sum (kernel launch)", static_cast<cudaError_t>(err));
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<StreamMark>> NewMark() override { return EventMark::Create(); }

  absl::StatusOr<bool> Capturing(void* stream) const override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaError_t err = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &st);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return common::Annotate(CudaStatus("cudaStreamIsCapturing", err),
                              "cannot tell whether the stream is being captured (the legacy default stream "
                              "cannot be used while another stream captures in global mode): ");
    }
    if (st == cudaStreamCaptureStatusInvalidated) {
      return absl::FailedPreconditionError(
          "the stream's CUDA graph capture was invalidated by an earlier error; the AllGather cannot be captured");
    }
    return st == cudaStreamCaptureStatusActive;
  }
  absl::Status OnGraphSlotTaken(void* stream, uint32_t slot, std::shared_ptr<GraphSlotsFreed> freed) override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaGraph_t graph = nullptr;
    DMAG_CUDA_RETURN_IF_ERROR(cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &st, nullptr, &graph));
    if (st != cudaStreamCaptureStatusActive || graph == nullptr) {
      return absl::FailedPreconditionError("the stream is no longer being captured");
    }
    auto* owner = new GraphSlotOwner{slot, std::move(freed)};
    cudaUserObject_t obj = nullptr;
    cudaError_t err = cudaUserObjectCreate(&obj, owner, &GraphSlotOwner::Destroy, 1, cudaUserObjectNoDestructorSync);
    if (err != cudaSuccess) {
      delete owner;
      return CudaStatus("cudaUserObjectCreate", err);
    }
    err = cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove);
    if (err != cudaSuccess) {
      cudaUserObjectRelease(obj, 1);  // Runs Destroy: the slot is free again.
      return CudaStatus("cudaGraphRetainUserObject", err);
    }
    return absl::OkStatus();
  }
  absl::Status WriteGraphReady(void* stream, uint32_t slot) override {
    const uint64_t ready = graph_dev_ + offsetof(abi::GraphFlagsV1, ready) + sizeof(uint32_t) * slot;
    return CuStatus("cuStreamWriteValue32(graph ready flag)",
                    api_->cuStreamWriteValue32(static_cast<CUstream>(stream), ready, 1, 0));
  }
  absl::Status WaitGraphDone(void* stream, uint32_t slot) override {
    // Low word: this replay is done; high word: released for good (job
    // failed, daemon gone). Then re-arm the low word for the next replay.
    const uint64_t done = graph_dev_ + offsetof(abi::GraphFlagsV1, done) + sizeof(abi::DoneWordV1) * slot;
    CUresult r = api_->cuStreamWaitValue64(static_cast<CUstream>(stream), done, 1, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) return CuStatus("cuStreamWaitValue64(graph done flag)", r);
    return CuStatus("cuStreamWriteValue32(graph done flag reset)",
                    api_->cuStreamWriteValue32(static_cast<CUstream>(stream), done, 0, 0));
  }
  absl::Status WaitDoneOnStream(void* stream, uint32_t seq) override {
    return CuStatus("cuStreamWaitValue32(done flag)",
                    api_->cuStreamWaitValue32(static_cast<CUstream>(stream), done_dev_, seq, CU_STREAM_WAIT_VALUE_GEQ));
  }

 private:
  CudaBackend(const ::dmagather::common::cuda::DriverApi* api, int device, abi::CompletionV1* block, uint64_t ready_dev,
              uint64_t done_dev, uint64_t graph_dev)
      : api_(api),
        memory_(std::make_shared<CudaMemory>(api)),
        vmm_(api),
        device_(device),
        block_(block),
        ready_dev_(ready_dev),
        done_dev_(done_dev),
        graph_dev_(graph_dev) {}

  const ::dmagather::common::cuda::DriverApi* const api_;
  const std::shared_ptr<const CudaMemory> memory_;
  const CudaVmmDriver vmm_;
  const int device_;
  abi::CompletionV1* const block_;
  const uint64_t ready_dev_;
  const uint64_t done_dev_;
  const uint64_t graph_dev_;  // Device address of the GraphFlagsV1 block.
  // Own-shard copies as one batch call (DMAGATHER_CUDA_BATCH=0: plain
  // cudaMemcpyAsync; turned off for good if the runtime refuses the batch).
  bool batch_copies_ = ::dmagather::common::cuda::BatchCopiesEnabled();
  struct Batch {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    void Clear() {
      dsts.clear();
      srcs.clear();
      sizes.clear();
    }
    void Add(void* d, const void* s, uint64_t b) {
      dsts.push_back(d);
      srcs.push_back(s);
      sizes.push_back(b);
    }
  } batch_;
};

// The device's uuid and bus id, which the daemon maps to its own numbering.
void IdentifyDevice(int device, std::string* uuid, std::string* pci_bus_id) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    uuid->assign(prop.uuid.bytes, sizeof(prop.uuid.bytes));
  } else {
    cudaGetLastError();
  }
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) == cudaSuccess) {
    *pci_bus_id = bus;
  } else {
    cudaGetLastError();
  }
}

const bool kRegistered =
    RegisterClientBackend(ClientBackendEntry{"cuda", 100, CurrentDevice, "cuda", CudaBackend::Create, IdentifyDevice});

}  // namespace
}  // namespace dmagather::client

// The cuda client backend: the CUDA side of a rank when dmagatherd runs the
// cuda backend. Registers the rank's completion block with CUDA (so its
// streams can write ready_seq and wait on done_seq), describes device
// pointers (allocation base, size, buffer id, device) for the registration
// cache, exports IPC handles, and enqueues the stream operations of a
// submit: the out-of-place self-shard copy, the ready write and the done
// wait. No host synchronisation anywhere.
//
// Threads: the rank's submitting thread (CommImpl's caller).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_format.h"
#include "client/backend.h"
#include "common/cuda/cuda_api.h"
#include "common/memory_kinds.h"
#include "common/status.h"

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

class CudaBuffer : public OwnedBuffer {
 public:
  CudaBuffer(void* p, MemoryExport exp) : p_(p), exp_(std::move(exp)) {}
  ~CudaBuffer() override {
    if (cudaFree(p_) != cudaSuccess) cudaGetLastError();
  }
  void* data() const override { return p_; }
  const MemoryExport& export_info() const override { return exp_; }

 private:
  void* const p_;
  const MemoryExport exp_;
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
    cudaError_t err = cudaHostGetDevicePointer(&ready, &block->ready_seq, 0);
    if (err == cudaSuccess) err = cudaHostGetDevicePointer(&done, &block->done_seq, 0);
    if (err != cudaSuccess) {
      cudaHostUnregister(block);
      return CudaStatus("cudaHostGetDevicePointer(completion flags)", err);
    }
    return std::unique_ptr<ClientBackend>(new CudaBackend(api, ctx.device, block, reinterpret_cast<uint64_t>(ready),
                                                          reinterpret_cast<uint64_t>(done)));
  }
  ~CudaBackend() override {
    if (cudaHostUnregister(block_) != cudaSuccess) cudaGetLastError();
  }

  const char* name() const override { return "cuda"; }

  absl::StatusOr<std::unique_ptr<OwnedBuffer>> Allocate(uint64_t bytes) override {
    DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    void* p = nullptr;
    DMAG_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
    auto exp = Describe(p, bytes);
    if (!exp.ok()) {
      cudaFree(p);
      return exp.status();
    }
    return std::unique_ptr<OwnedBuffer>(new CudaBuffer(p, *std::move(exp)));
  }

  absl::StatusOr<MemoryExport> Describe(const void* ptr, uint64_t bytes) const override {
    const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(ptr);
    unsigned int type = 0;
    CUresult r = api_->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
    if (r != CUDA_SUCCESS || type != CU_MEMORYTYPE_DEVICE) {
      return common::FallbackError(absl::StrFormat(
          "%p is not CUDA device memory (the cuda backend moves device buffers; host or managed memory is not "
          "supported)",
          ptr));
    }
    int ordinal = -1;
    r = api_->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
    if (r != CUDA_SUCCESS) return CuStatus("cuPointerGetAttribute(DEVICE_ORDINAL)", r);
    if (ordinal != device_) {
      return absl::InvalidArgumentError(
          absl::StrFormat("buffer %p is on CUDA device %d, but the rank uses device %d", ptr, ordinal, device_));
    }
    MemoryExport e;
    unsigned long long id = 0;
    r = api_->cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
    if (r != CUDA_SUCCESS) return CuStatus("cuPointerGetAttribute(BUFFER_ID)", r);
    e.buffer_id = id;
    CUdeviceptr base = 0;
    size_t size = 0;
    r = api_->cuMemGetAddressRange(&base, &size, p);
    if (r != CUDA_SUCCESS) return CuStatus("cuMemGetAddressRange", r);
    e.base = static_cast<uintptr_t>(base);
    e.bytes = size;
    const uintptr_t at = reinterpret_cast<uintptr_t>(ptr);
    if (at - e.base > e.bytes || bytes > e.bytes - (at - e.base)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "buffer %p + %u bytes runs past the end of its CUDA allocation (%u bytes at 0x%x)", ptr, bytes, e.bytes,
          e.base));
    }
    cudaIpcMemHandle_t h;
    cudaError_t err = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(e.base));
    if (err != cudaSuccess) {
      cudaGetLastError();
      absl::Status st = CudaStatus("cudaIpcGetMemHandle", err);
      return common::FallbackError(absl::StrCat(
          st.message(), ": this allocation cannot be shared with dmagatherd through CUDA IPC (memory from "
          "cudaMalloc can; stream-ordered pools and VMM allocations such as expandable segments cannot)"));
    }
    e.memory_kind = common::kMemoryCudaIpc;
    e.handle.assign(reinterpret_cast<const char*>(&h), sizeof(h));
    return e;
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
  absl::Status CopyAsync(void* dst, const void* src, uint64_t bytes, void* stream) override {
    DMAG_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
    return absl::OkStatus();
  }
  absl::Status WriteReady(void* stream, uint32_t seq) override {
    return CuStatus("cuStreamWriteValue32(ready flag)",
                    api_->cuStreamWriteValue32(static_cast<CUstream>(stream), ready_dev_, seq, 0));
  }
  bool has_stream_waits() const override { return true; }
  absl::Status WaitDoneOnStream(void* stream, uint32_t seq) override {
    return CuStatus("cuStreamWaitValue32(done flag)",
                    api_->cuStreamWaitValue32(static_cast<CUstream>(stream), done_dev_, seq,
                                              CU_STREAM_WAIT_VALUE_GEQ));
  }

 private:
  CudaBackend(const ::dmagather::common::cuda::DriverApi* api, int device, abi::CompletionV1* block,
              uint64_t ready_dev, uint64_t done_dev)
      : api_(api), device_(device), block_(block), ready_dev_(ready_dev), done_dev_(done_dev) {}

  const ::dmagather::common::cuda::DriverApi* const api_;
  const int device_;
  abi::CompletionV1* const block_;
  const uint64_t ready_dev_;
  const uint64_t done_dev_;
};

const bool kRegistered = RegisterClientBackend(ClientBackendEntry{
    "cuda", 100, CurrentDevice, "cuda", CudaBackend::Create});

}  // namespace
}  // namespace dmagather::client

#include "client/cuda_client.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_format.h"
#include "common/cuda/cuda_api.h"
#include "common/status.h"

namespace dmagather::client {

using ::dmagather::common::cuda::CudaStatus;
using ::dmagather::common::cuda::CuStatus;

int CudaClient::CurrentDevice() {
  if (!::dmagather::common::cuda::CudaAvailable().ok()) return -1;
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return d;
}

absl::StatusOr<std::unique_ptr<CudaClient>> CudaClient::Create(int device, abi::CompletionV1* block,
                                                               uint64_t bytes) {
  DMAG_RETURN_IF_ERROR(::dmagather::common::cuda::Driver().status());
  DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  DMAG_CUDA_RETURN_IF_ERROR(cudaHostRegister(block, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
  void* ready = nullptr;
  void* done = nullptr;
  cudaError_t err = cudaHostGetDevicePointer(&ready, &block->ready_seq, 0);
  if (err == cudaSuccess) err = cudaHostGetDevicePointer(&done, &block->done_seq, 0);
  if (err != cudaSuccess) {
    cudaHostUnregister(block);
    return CudaStatus("cudaHostGetDevicePointer(completion flags)", err);
  }
  return std::unique_ptr<CudaClient>(
      new CudaClient(device, block, reinterpret_cast<uint64_t>(ready), reinterpret_cast<uint64_t>(done)));
}

CudaClient::~CudaClient() {
  if (cudaHostUnregister(block_) != cudaSuccess) cudaGetLastError();
}

absl::StatusOr<CudaClient::Allocation> CudaClient::Describe(const void* ptr) const {
  DMAG_ASSIGN_OR_RETURN(const ::dmagather::common::cuda::DriverApi* api, ::dmagather::common::cuda::Driver());
  const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(ptr);
  unsigned int type = 0;
  CUresult r = api->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
  if (r != CUDA_SUCCESS || type != CU_MEMORYTYPE_DEVICE) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%p is not CUDA device memory (the cuda backend moves device buffers; host or managed memory is not "
        "supported)", ptr));
  }
  Allocation a;
  int ordinal = -1;
  r = api->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
  if (r != CUDA_SUCCESS) return CuStatus("cuPointerGetAttribute(DEVICE_ORDINAL)", r);
  a.device = ordinal;
  unsigned long long id = 0;
  r = api->cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
  if (r != CUDA_SUCCESS) return CuStatus("cuPointerGetAttribute(BUFFER_ID)", r);
  a.buffer_id = id;
  CUdeviceptr base = 0;
  size_t size = 0;
  r = api->cuMemGetAddressRange(&base, &size, p);
  if (r != CUDA_SUCCESS) return CuStatus("cuMemGetAddressRange", r);
  a.base = static_cast<uintptr_t>(base);
  a.bytes = size;
  return a;
}

uint64_t CudaClient::BufferId(const void* ptr) const {
  auto api = ::dmagather::common::cuda::Driver();
  if (!api.ok()) return 0;
  unsigned long long id = 0;
  if ((*api)->cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, reinterpret_cast<CUdeviceptr>(ptr)) !=
      CUDA_SUCCESS) {
    return 0;
  }
  return id;
}

absl::StatusOr<std::string> CudaClient::IpcHandle(uintptr_t base) const {
  cudaIpcMemHandle_t h;
  cudaError_t err = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base));
  if (err != cudaSuccess) {
    cudaGetLastError();
    absl::Status st = CudaStatus("cudaIpcGetMemHandle", err);
    return absl::FailedPreconditionError(absl::StrCat(
        st.message(), ": this allocation cannot be shared with dmagatherd through CUDA IPC (memory from "
        "cudaMalloc can; stream-ordered pools and VMM allocations such as expandable segments cannot)"));
  }
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

absl::StatusOr<void*> CudaClient::Malloc(uint64_t bytes) {
  DMAG_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  void* p = nullptr;
  DMAG_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  return p;
}

absl::Status CudaClient::Free(void* ptr) {
  DMAG_CUDA_RETURN_IF_ERROR(cudaFree(ptr));
  return absl::OkStatus();
}

absl::Status CudaClient::CopyAsync(void* dst, const void* src, uint64_t bytes, void* stream) {
  DMAG_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

absl::Status CudaClient::WriteReady(void* stream, uint32_t seq) {
  DMAG_ASSIGN_OR_RETURN(const ::dmagather::common::cuda::DriverApi* api, ::dmagather::common::cuda::Driver());
  CUresult r = api->cuStreamWriteValue32(static_cast<CUstream>(stream), ready_dev_, seq, 0);
  return CuStatus("cuStreamWriteValue32(ready flag)", r);
}

absl::Status CudaClient::WaitDone(void* stream, uint32_t seq) {
  DMAG_ASSIGN_OR_RETURN(const ::dmagather::common::cuda::DriverApi* api, ::dmagather::common::cuda::Driver());
  CUresult r = api->cuStreamWaitValue32(static_cast<CUstream>(stream), done_dev_, seq, CU_STREAM_WAIT_VALUE_GEQ);
  return CuStatus("cuStreamWaitValue32(done flag)", r);
}

}  // namespace dmagather::client

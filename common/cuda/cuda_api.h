// The CUDA edge shared by dmagatherd's cuda engine and libdmagather: CUDA
// errors become absl::Status once, here, naming the call and the code; and
// the few driver functions we need (stream memory operations, address
// ranges, pointer attributes) are reached through cudaGetDriverEntryPoint,
// so nothing links libcuda.so and the binaries start on machines without a
// driver (there, CudaAvailable() says why not).
//
// Threads: everything here is thread-safe; the entry points are resolved
// once (first caller) and immutable after.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dmagather::common::cuda {

// "cudaIpcOpenMemHandle: cudaErrorInvalidValue (invalid argument)".
absl::Status CudaStatus(const char* call, cudaError_t err);
absl::Status CuStatus(const char* call, CUresult res);

#define DMAG_CUDA_RETURN_IF_ERROR(call)                                    \
  do {                                                                     \
    cudaError_t dmag_cuda_err_ = (call);                                   \
    if (dmag_cuda_err_ != cudaSuccess) {                                   \
      return ::dmagather::common::cuda::CudaStatus(#call, dmag_cuda_err_); \
    }                                                                      \
  } while (0)

// Driver functions, by entry point (versions as of CUDA 12/13).
struct DriverApi {
  CUresult (*cuStreamWriteValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*cuStreamWaitValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*cuStreamBatchMemOp)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int) = nullptr;
  CUresult (*cuMemGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*cuPointerGetAttribute)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  // 64-bit waits (graph-captured ops wait on a 64-bit done word).
  CUresult (*cuStreamWaitValue64)(CUstream, CUdeviceptr, cuuint64_t, unsigned int) = nullptr;
  // Virtual memory management (VMM: cuMemCreate memory, e.g. PyTorch's
  // expandable segments): export in the client, import and map in the daemon.
  CUresult (*cuMemRetainAllocationHandle)(CUmemGenericAllocationHandle*, void*) = nullptr;
  CUresult (*cuMemGetAllocationPropertiesFromHandle)(CUmemAllocationProp*, CUmemGenericAllocationHandle) = nullptr;
  CUresult (*cuMemExportToShareableHandle)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                                           unsigned long long) = nullptr;
  CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) = nullptr;
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*cuMemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*cuMemGetAllocationGranularity)(size_t*, const CUmemAllocationProp*,
                                            CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                          unsigned long long) = nullptr;
};

// OK with the number of devices (>= 1), or why CUDA cannot be used here
// (no driver, no device). Cheap after the first call.
absl::StatusOr<int> CudaAvailable();

// The driver functions; an error if CUDA is unavailable or one is missing.
absl::StatusOr<const DriverApi*> Driver();

// DMAGATHER_CUDA_BATCH is not "0": copies go out as cudaMemcpyBatchAsync
// (the daemon's chunks, a rank's own shards), else as cudaMemcpyAsync.
bool BatchCopiesEnabled();

// cudaMemcpyBatchAsync as CUDA 13 declares it. CUDA 12.8/12.9 declare it
// with non-const pointers and a failIdx before the stream; from a CUDA 12
// runtime on a driver older than 12.8 it fails with
// cudaErrorCallRequiresNewerDriver, reported here as cudaErrorNotSupported
// (the callers then fall back to cudaMemcpyAsync).
inline cudaError_t MemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                                    cudaMemcpyAttributes* attrs, size_t* attr_idx, size_t num_attrs, cudaStream_t s) {
#if CUDART_VERSION >= 13000
  return cudaMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attr_idx, num_attrs, s);
#else
  size_t fail_idx = 0;
  cudaError_t err = cudaMemcpyBatchAsync(const_cast<void**>(dsts), const_cast<void**>(srcs), const_cast<size_t*>(sizes),
                                         count, attrs, attr_idx, num_attrs, &fail_idx, s);
  if (err == cudaErrorCallRequiresNewerDriver) {
    cudaGetLastError();
    return cudaErrorNotSupported;
  }
  return err;
#endif
}

}  // namespace dmagather::common::cuda

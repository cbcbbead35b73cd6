#include "server/engines/gpu/cuda/cuda_memops.h"

#include <glog/logging.h>

#include <cstring>

namespace dmagather::server::engines::gpu::cuda {

absl::Status StreamMemOps(const common::cuda::DriverApi& api, int device, CUstream stream, const uint64_t* flags,
                          size_t n, uint32_t value, bool write, std::vector<CUstreamBatchMemOpParams>* scratch,
                          bool* batch_ok) {
  std::vector<CUstreamBatchMemOpParams>& memops = *scratch;
  memops.clear();
  for (size_t i = 0; i < n; ++i) {
    CUstreamBatchMemOpParams p;
    std::memset(&p, 0, sizeof(p));
    if (write) {
      p.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
      p.writeValue.address = static_cast<CUdeviceptr>(flags[i]);
      p.writeValue.value = value;
      p.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
    } else {
      p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
      p.waitValue.address = static_cast<CUdeviceptr>(flags[i]);
      p.waitValue.value = value;
      p.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    }
    memops.push_back(p);
  }
  if (*batch_ok) {
    CUresult r = api.cuStreamBatchMemOp(stream, static_cast<unsigned>(memops.size()), memops.data(), 0);
    if (r == CUDA_SUCCESS) return absl::OkStatus();
    LOG(WARNING) << "device " << device << ": " << common::cuda::CuStatus("cuStreamBatchMemOp", r).message()
                 << "; using one stream memory operation per rank on this device";
    *batch_ok = false;
  }
  for (size_t i = 0; i < n; ++i) {
    CUresult r = write ? api.cuStreamWriteValue32(stream, flags[i], value, CU_STREAM_WRITE_VALUE_DEFAULT)
                       : api.cuStreamWaitValue32(stream, flags[i], value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) {
      return common::cuda::CuStatus(write ? "cuStreamWriteValue32(done flag)" : "cuStreamWaitValue32(ready flag)", r);
    }
  }
  return absl::OkStatus();
}

}  // namespace dmagather::server::engines::gpu::cuda

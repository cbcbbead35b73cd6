// kernels/reduce.h on CUDA: checks the arguments, plans the grid from the
// current device's SM count and launches the kernels of
// kernels/reduce_device.h.
#include <cuda_runtime.h>

#include "common/dtype.h"
#include "common/reduce.h"
#include "kernels/reduce.h"
#include "kernels/reduce_device.h"

namespace dmagather::kernels {
namespace {

struct CudaRt {
  using Stream = cudaStream_t;
  static constexpr int kInvalidValue = int(cudaErrorInvalidValue);
  static int Sms(int* sms) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
    return int(e);
  }
  static int LastError() { return int(cudaGetLastError()); }
};

using Calls = reduce_device::HostCalls<CudaRt>;

}  // namespace

int ReduceGridFor(const void* in, uint64_t count, uint32_t dtype, const void* out, ReduceGrid* grid,
                  unsigned max_blocks) {
  reduce_device::Plan p;
  int sms = 0;
  if (const int e = Calls::GridFor(in, count, dtype, out, max_blocks, &p, &sms); e != 0) return e;
  *grid = {p.blocks, reduce_device::kThreads, p.vectorized, sms};
  return 0;
}

int ReduceChunksOnBlocks(const void* const* chunks, int n, uint64_t count, uint32_t dtype, int redop, void* out,
                         unsigned max_blocks, void* stream) {
  return Calls::OnBlocks(chunks, n, count, dtype, redop, out, max_blocks, stream);
}

int ReduceChunksOnBlocks(const void* in, int n, uint64_t count, uint32_t dtype, int redop, void* out,
                         unsigned max_blocks, void* stream) {
  return Calls::OnBlocksDense(in, n, count, dtype, redop, out, max_blocks, stream);
}

int ReduceChunks(const void* const* chunks, int n, uint64_t count, uint32_t dtype, int redop, void* out, void* stream) {
  return Calls::OnBlocks(chunks, n, count, dtype, redop, out, 0, stream);
}

int ReduceChunks(const void* in, int n, uint64_t count, uint32_t dtype, int redop, void* out, void* stream) {
  return Calls::OnBlocksDense(in, n, count, dtype, redop, out, 0, stream);
}

}  // namespace dmagather::kernels

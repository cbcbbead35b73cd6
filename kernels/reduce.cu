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

#include "kernels/reduce_entry_points.inc"  // NOLINT(build/include): the entry points, over Calls.

}  // namespace dmagather::kernels

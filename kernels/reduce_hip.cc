// kernels/reduce_hip.h: the kernels of kernels/reduce_device.h on AMD GPUs,
// compiled by HIP-Clang; the same checks and grid plan as kernels/reduce.cu
// (compute units for SMs).
#include "kernels/reduce_hip.h"

#include <hip/hip_runtime.h>

#include "common/dtype.h"
#include "common/reduce.h"
#include "kernels/reduce.h"
#include "kernels/reduce_device.h"

namespace dmagather::kernels::hip {
namespace {

struct HipRt {
  using Stream = hipStream_t;
  static constexpr int kInvalidValue = int(hipErrorInvalidValue);
  static int Sms(int* sms) {
    int dev = 0;
    hipError_t e = hipGetDevice(&dev);
    if (e == hipSuccess) e = hipDeviceGetAttribute(sms, hipDeviceAttributeMultiprocessorCount, dev);
    return int(e);
  }
  static int LastError() { return int(hipGetLastError()); }
};

using Calls = reduce_device::HostCalls<HipRt>;

}  // namespace

#include "kernels/reduce_entry_points.inc"  // NOLINT(build/include): the entry points, over Calls.

}  // namespace dmagather::kernels::hip

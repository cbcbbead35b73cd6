#include "common/cuda/cuda_api.h"

#include <mutex>

#include "absl/strings/str_cat.h"

namespace dmagather::common::cuda {
namespace {

absl::StatusCode CodeOf(cudaError_t err) {
  switch (err) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
      return absl::StatusCode::kUnavailable;
    case cudaErrorNotSupported:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

struct State {
  absl::Status available = absl::OkStatus();
  int devices = 0;
  DriverApi api;
  absl::Status driver = absl::OkStatus();
};

template <typename Fn>
absl::Status Resolve(const char* symbol, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &q);
  if (err != cudaSuccess)
    return CudaStatus(absl::StrCat("cudaGetDriverEntryPointByVersion(", symbol, ")").c_str(), err);
  if (q != cudaDriverEntryPointSuccess || p == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA driver has no ", symbol, " (entry point query result ", int(q), ")"));
  }
  *fn = reinterpret_cast<Fn>(p);
  return absl::OkStatus();
}

// cudaGetDeviceCount's failure, with the driver's CUDA version beside the
// one this build needs when the driver is missing or older (the reason
// `health` and the log give for the cuda backend).
absl::Status DriverTooOld(const absl::Status& failed) {
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
    return absl::UnavailableError(
        absl::StrCat("no NVIDIA driver (libcuda.so.1) on this machine (", failed.message(), ")"));
  }
  // CUDA minor version compatibility: a CUDA 12 runtime runs on any CUDA 12
  // driver (R525 or newer), so a CUDA 12 build needs 12.0, not its own minor.
  constexpr int kNeeded = CUDART_VERSION >= 13000 ? CUDART_VERSION : CUDART_VERSION / 1000 * 1000;
  if (driver < kNeeded) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NVIDIA driver supports CUDA ", driver / 1000, ".", driver % 1000 / 10,
                     "; this build needs CUDA ", kNeeded / 1000, ".", kNeeded % 1000 / 10,
                     CUDART_VERSION >= 13000 ? " (an R580 driver or newer)" : " (an R525 driver or newer)", " (",
                     failed.message(), ")"));
  }
  return failed;
}

const State& Get() {
  static State* state = [] {
    auto* s = new State;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      s->available = DriverTooOld(CudaStatus("cudaGetDeviceCount", err));
      cudaGetLastError();  // Not sticky; keep later runtime calls clean.
    } else if (n == 0) {
      s->available = absl::UnavailableError("cudaGetDeviceCount: no CUDA device is visible");
    }
    s->devices = n;
    if (!s->available.ok()) {
      s->driver = s->available;
      return s;
    }
    absl::Status st;
    st.Update(Resolve("cuStreamWriteValue32", &s->api.cuStreamWriteValue32));
    st.Update(Resolve("cuStreamWaitValue32", &s->api.cuStreamWaitValue32));
    st.Update(Resolve("cuStreamBatchMemOp", &s->api.cuStreamBatchMemOp));
    st.Update(Resolve("cuMemGetAddressRange", &s->api.cuMemGetAddressRange));
    st.Update(Resolve("cuPointerGetAttribute", &s->api.cuPointerGetAttribute));
    st.Update(Resolve("cuGetErrorName", &s->api.cuGetErrorName));
    st.Update(Resolve("cuStreamWaitValue64", &s->api.cuStreamWaitValue64));
    st.Update(Resolve("cuMemRetainAllocationHandle", &s->api.cuMemRetainAllocationHandle));
    st.Update(Resolve("cuMemGetAllocationPropertiesFromHandle", &s->api.cuMemGetAllocationPropertiesFromHandle));
    st.Update(Resolve("cuMemExportToShareableHandle", &s->api.cuMemExportToShareableHandle));
    st.Update(Resolve("cuMemImportFromShareableHandle", &s->api.cuMemImportFromShareableHandle));
    st.Update(Resolve("cuMemRelease", &s->api.cuMemRelease));
    st.Update(Resolve("cuMemAddressReserve", &s->api.cuMemAddressReserve));
    st.Update(Resolve("cuMemAddressFree", &s->api.cuMemAddressFree));
    st.Update(Resolve("cuMemMap", &s->api.cuMemMap));
    st.Update(Resolve("cuMemUnmap", &s->api.cuMemUnmap));
    st.Update(Resolve("cuMemSetAccess", &s->api.cuMemSetAccess));
    st.Update(Resolve("cuMemGetAllocationGranularity", &s->api.cuMemGetAllocationGranularity));
    st.Update(Resolve("cuMemCreate", &s->api.cuMemCreate));
    s->driver = st;
    return s;
  }();
  return *state;
}

}  // namespace

absl::Status CudaStatus(const char* call, cudaError_t err) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::Status(CodeOf(err), absl::StrCat(call, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

absl::Status CuStatus(const char* call, CUresult res) {
  if (res == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = nullptr;
  const State& s = Get();
  if (s.api.cuGetErrorName != nullptr) s.api.cuGetErrorName(res, &name);
  return absl::InternalError(absl::StrCat(call, ": ", name != nullptr ? name : "CUresult", " (", int(res), ")"));
}

absl::StatusOr<int> CudaAvailable() {
  const State& s = Get();
  if (!s.available.ok()) return s.available;
  return s.devices;
}

absl::StatusOr<const DriverApi*> Driver() {
  const State& s = Get();
  if (!s.driver.ok()) return s.driver;
  return &s.api;
}

bool BatchCopiesEnabled() {
  const char* env = std::getenv("DMAGATHER_CUDA_BATCH");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

}  // namespace dmagather::common::cuda

#include "common/hip/hip_api.h"

#include <dlfcn.h>
#include <hip/hip_version.h>

#include <mutex>

#include "absl/strings/str_cat.h"

namespace dmagather::common::hip {
namespace {

absl::StatusCode CodeOf(hipError_t err) {
  switch (err) {
    case hipErrorInvalidValue:
    case hipErrorInvalidDevicePointer:
    case hipErrorInvalidResourceHandle:
      return absl::StatusCode::kInvalidArgument;
    case hipErrorOutOfMemory:
      return absl::StatusCode::kResourceExhausted;
    case hipErrorNoDevice:
    case hipErrorInsufficientDriver:
    case hipErrorNotInitialized:
      return absl::StatusCode::kUnavailable;
    case hipErrorNotSupported:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status MakeStatus(const HipApi& a, const char* call, hipError_t err) {
  const char* name = a.hipGetErrorName != nullptr ? a.hipGetErrorName(err) : nullptr;
  const char* text = a.hipGetErrorString != nullptr ? a.hipGetErrorString(err) : nullptr;
  return absl::Status(CodeOf(err), absl::StrCat(call, ": ", name != nullptr ? name : "hipError", " (",
                                                text != nullptr ? std::string(text) : absl::StrCat(int(err)), ")"));
}

struct State {
  HipApi api;
  absl::Status loaded = absl::OkStatus();
  absl::Status available = absl::OkStatus();
  int devices = 0;
  std::string description;
};

template <typename Fn>
bool Resolve(void* lib, const char* symbol, Fn* fn, std::string* missing) {
  void* p = dlsym(lib, symbol);
  if (p == nullptr) {
    absl::StrAppend(missing, missing->empty() ? "" : ", ", symbol);
    return false;
  }
  *fn = reinterpret_cast<Fn>(p);
  return true;
}

#define DMAG_HIP_STR2(x) #x
#define DMAG_HIP_STR(x) DMAG_HIP_STR2(x)

const State& Get() {
  static State* state = [] {
    auto* s = new State;
    const char* soname = "libamdhip64.so." DMAG_HIP_STR(HIP_VERSION_MAJOR);
    void* lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      s->loaded = absl::UnavailableError(absl::StrCat(
          "cannot load ", soname, " (ROCm ", HIP_VERSION_MAJOR, ".x HIP runtime; this build's HIP headers are ",
          HIP_VERSION_MAJOR, ".", HIP_VERSION_MINOR, "): ", why != nullptr ? why : "dlopen failed"));
      s->available = s->loaded;
      return s;
    }
    std::string missing;
    HipApi& a = s->api;
    Resolve(lib, "hipGetDeviceCount", &a.hipGetDeviceCount, &missing);
    Resolve(lib, "hipGetDevice", &a.hipGetDevice, &missing);
    Resolve(lib, "hipSetDevice", &a.hipSetDevice, &missing);
    Resolve(lib, "hipRuntimeGetVersion", &a.hipRuntimeGetVersion, &missing);
    Resolve(lib, "hipGetLastError", &a.hipGetLastError, &missing);
    Resolve(lib, "hipGetErrorName", &a.hipGetErrorName, &missing);
    Resolve(lib, "hipGetErrorString", &a.hipGetErrorString, &missing);
    Resolve(lib, "hipDeviceCanAccessPeer", &a.hipDeviceCanAccessPeer, &missing);
    Resolve(lib, "hipDeviceEnablePeerAccess", &a.hipDeviceEnablePeerAccess, &missing);
    Resolve(lib, "hipStreamCreateWithFlags", &a.hipStreamCreateWithFlags, &missing);
    Resolve(lib, "hipStreamDestroy", &a.hipStreamDestroy, &missing);
    Resolve(lib, "hipEventCreateWithFlags", &a.hipEventCreateWithFlags, &missing);
    Resolve(lib, "hipEventDestroy", &a.hipEventDestroy, &missing);
    Resolve(lib, "hipEventRecord", &a.hipEventRecord, &missing);
    Resolve(lib, "hipEventQuery", &a.hipEventQuery, &missing);
    Resolve(lib, "hipStreamWaitEvent", &a.hipStreamWaitEvent, &missing);
    Resolve(lib, "hipHostRegister", &a.hipHostRegister, &missing);
    Resolve(lib, "hipHostUnregister", &a.hipHostUnregister, &missing);
    Resolve(lib, "hipHostGetDevicePointer", &a.hipHostGetDevicePointer, &missing);
    Resolve(lib, "hipIpcGetMemHandle", &a.hipIpcGetMemHandle, &missing);
    Resolve(lib, "hipIpcOpenMemHandle", &a.hipIpcOpenMemHandle, &missing);
    Resolve(lib, "hipIpcCloseMemHandle", &a.hipIpcCloseMemHandle, &missing);
    Resolve(lib, "hipMemGetAddressRange", &a.hipMemGetAddressRange, &missing);
    Resolve(lib, "hipPointerGetAttribute", &a.hipPointerGetAttribute, &missing);
    Resolve(lib, "hipMalloc", &a.hipMalloc, &missing);
    Resolve(lib, "hipFree", &a.hipFree, &missing);
    Resolve(lib, "hipMemcpyAsync", &a.hipMemcpyAsync, &missing);
    Resolve(lib, "hipStreamWriteValue32", &a.hipStreamWriteValue32, &missing);
    Resolve(lib, "hipStreamWaitValue32", &a.hipStreamWaitValue32, &missing);
    if (!missing.empty()) {
      s->loaded = absl::UnavailableError(absl::StrCat(soname, " lacks ", missing));
      s->available = s->loaded;
      return s;
    }
    int version = 0;
    if (a.hipRuntimeGetVersion(&version) != hipSuccess) version = 0;
    (void)a.hipGetLastError();
    s->description = absl::StrCat(soname, " (HIP runtime ", version, ")");
    int n = 0;
    hipError_t err = a.hipGetDeviceCount(&n);
    if (err != hipSuccess) {
      s->available = MakeStatus(a, "hipGetDeviceCount", err);
      (void)a.hipGetLastError();  // Keep later calls clean.
      if (err == hipErrorNoDevice) {
        s->available = absl::UnavailableError(absl::StrCat(
            s->available.message(), ": no AMD GPU is visible (no amdgpu/kfd driver, or HIP_VISIBLE_DEVICES / "
            "ROCR_VISIBLE_DEVICES hide them)"));
      }
    } else if (n == 0) {
      s->available = absl::UnavailableError("hipGetDeviceCount: no AMD GPU is visible");
    }
    s->devices = n;
    return s;
  }();
  return *state;
}

}  // namespace

absl::Status HipStatus(const char* call, hipError_t err) {
  if (err == hipSuccess) return absl::OkStatus();
  return MakeStatus(Get().api, call, err);
}

absl::StatusOr<const HipApi*> Hip() {
  const State& s = Get();
  if (!s.loaded.ok()) return s.loaded;
  return &s.api;
}

absl::StatusOr<int> HipAvailable() {
  const State& s = Get();
  if (!s.available.ok()) return s.available;
  return s.devices;
}

std::string HipLibraryDescription() { return Get().description; }

}  // namespace dmagather::common::hip

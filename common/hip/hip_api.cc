#include "common/hip/hip_api.h"

#include <dlfcn.h>
#include <hip/hip_version.h>

#include <cstdlib>
#include <memory>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/hip/hip_library.h"

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

// hipRuntimeGetVersion's encoding (HIP_VERSION).
constexpr int kMajorScale = 10000000;
constexpr int kMinorScale = 100000;

// The table below must agree with the headers this file is compiled
// against, whatever ROCm they come from (tools/check_hip_build.sh builds it
// against each one).
constexpr int kHeaderMajor = HIP_VERSION_MAJOR;
static_assert(hipMemcpyDeviceToDevice == 3, "hipMemcpyDeviceToDevice moved");
static_assert(hipMemcpyDefault == 4, "hipMemcpyDefault moved");
static_assert(sizeof(hipIpcMemHandle_t) == 64, "hipIpcMemHandle_t changed size");
#if HIP_VERSION_MAJOR >= 6
static_assert(hipMemoryTypeDevice == 2, "hipMemoryTypeDevice of ROCm >= 6.0");
static_assert(hipIpcMemLazyEnablePeerAccess == 1, "hipIpcMemLazyEnablePeerAccess of ROCm >= 6.0");
#else
static_assert(hipMemoryTypeDevice == 1, "hipMemoryTypeDevice of ROCm 5.x");
static_assert(hipIpcMemLazyEnablePeerAccess == 0, "hipIpcMemLazyEnablePeerAccess of ROCm 5.x");
#endif
#ifdef DMAGATHER_HIP_HAS_MEMCPY_NOCU
static_assert(HIP_VERSION >= 60100000, "hipMemcpyDeviceToDeviceNoCU in headers older than 6.1");
static_assert(hipMemcpyDeviceToDeviceNoCU == 1024, "hipMemcpyDeviceToDeviceNoCU moved");
#endif

// HipApi's function types are the prototypes of the headers this file is
// built against: a call resolved by dlsym is made through HipApi's type, so
// a prototype that changed in some ROCm would go unnoticed at run time.
#define DMAG_HIP_SAME_PROTOTYPE(fn, type) \
  static_assert(std::is_same_v<decltype(&::fn), type>, #fn ": the HIP headers' prototype differs from HipApi's")
#define DMAG_HIP_CHECK_PROTOTYPE(fn) DMAG_HIP_SAME_PROTOTYPE(fn, decltype(HipApi::fn))
DMAG_HIP_CHECK_PROTOTYPE(hipGetDeviceCount);
DMAG_HIP_CHECK_PROTOTYPE(hipGetDevice);
DMAG_HIP_CHECK_PROTOTYPE(hipSetDevice);
DMAG_HIP_CHECK_PROTOTYPE(hipRuntimeGetVersion);
DMAG_HIP_CHECK_PROTOTYPE(hipGetLastError);
DMAG_HIP_CHECK_PROTOTYPE(hipGetErrorName);
DMAG_HIP_CHECK_PROTOTYPE(hipGetErrorString);
DMAG_HIP_CHECK_PROTOTYPE(hipDeviceGetUuid);
DMAG_HIP_CHECK_PROTOTYPE(hipDeviceGetPCIBusId);
DMAG_HIP_CHECK_PROTOTYPE(hipDeviceCanAccessPeer);
DMAG_HIP_CHECK_PROTOTYPE(hipDeviceEnablePeerAccess);
DMAG_HIP_CHECK_PROTOTYPE(hipStreamCreateWithFlags);
DMAG_HIP_CHECK_PROTOTYPE(hipStreamDestroy);
DMAG_HIP_CHECK_PROTOTYPE(hipEventCreateWithFlags);
DMAG_HIP_CHECK_PROTOTYPE(hipEventDestroy);
DMAG_HIP_CHECK_PROTOTYPE(hipEventRecord);
DMAG_HIP_CHECK_PROTOTYPE(hipEventQuery);
DMAG_HIP_CHECK_PROTOTYPE(hipStreamWaitEvent);
DMAG_HIP_CHECK_PROTOTYPE(hipHostRegister);
DMAG_HIP_CHECK_PROTOTYPE(hipHostUnregister);
DMAG_HIP_CHECK_PROTOTYPE(hipHostGetDevicePointer);
DMAG_HIP_CHECK_PROTOTYPE(hipIpcGetMemHandle);
DMAG_HIP_CHECK_PROTOTYPE(hipIpcOpenMemHandle);
DMAG_HIP_CHECK_PROTOTYPE(hipIpcCloseMemHandle);
DMAG_HIP_CHECK_PROTOTYPE(hipMemGetAddressRange);
DMAG_HIP_CHECK_PROTOTYPE(hipPointerGetAttribute);
// hipMalloc is overloaded in C++ (a template for T**): its C declaration is
// checked by redeclaring it (a different prototype is a conflicting
// declaration of a C function).
extern "C" hipError_t hipMalloc(void** ptr, size_t size);
static_assert(std::is_same_v<decltype(HipApi::hipMalloc), hipError_t (*)(void**, size_t)>, "hipMalloc");
DMAG_HIP_CHECK_PROTOTYPE(hipFree);
DMAG_HIP_CHECK_PROTOTYPE(hipMemcpyAsync);
DMAG_HIP_CHECK_PROTOTYPE(hipStreamWriteValue32);
DMAG_HIP_CHECK_PROTOTYPE(hipStreamWaitValue32);
DMAG_HIP_CHECK_PROTOTYPE(hipStreamGetFlags);
#if HIP_VERSION_MAJOR >= 6  // Declared from 6.0 (5.2's headers lack it).
DMAG_HIP_SAME_PROTOTYPE(hipStreamGetDevice, HipStreamGetDeviceFn);
#endif
#if HIP_VERSION_MAJOR > 7 || (HIP_VERSION_MAJOR == 7 && HIP_VERSION_MINOR >= 1)  // Declared from 7.1.
DMAG_HIP_SAME_PROTOTYPE(hipStreamGetId, HipStreamGetIdFn);
#endif
#undef DMAG_HIP_CHECK_PROTOTYPE
#undef DMAG_HIP_SAME_PROTOTYPE

struct State {
  std::unique_ptr<HipLibrary> lib;
  absl::Status loaded = absl::OkStatus();
  absl::Status available = absl::OkStatus();
  int devices = 0;
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

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

const State& Get() {
  static State* state = [] {
    auto* s = new State;
    auto lib = LoadHip(HipLibraryCandidates());
    if (!lib.ok()) {
      s->loaded = lib.status();
      s->available = s->loaded;
      return s;
    }
    s->lib = *std::move(lib);
    const HipApi& a = s->lib->api;
    int n = 0;
    hipError_t err = a.hipGetDeviceCount(&n);
    if (err != hipSuccess) {
      s->available = MakeStatus(a, "hipGetDeviceCount", err);
      (void)a.hipGetLastError();  // Keep later calls clean.
      if (err == hipErrorNoDevice) {
        s->available = absl::UnavailableError(
            absl::StrCat(s->available.message(),
                         ": no AMD GPU is visible (no amdgpu/kfd driver, or HIP_VISIBLE_DEVICES / "
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
  const State& s = Get();
  static const HipApi kNone;
  return MakeStatus(s.lib != nullptr ? s.lib->api : kNone, call, err);
}

absl::StatusOr<const HipApi*> Hip() {
  const State& s = Get();
  if (!s.loaded.ok()) return s.loaded;
  return &s.lib->api;
}

absl::StatusOr<int> HipAvailable() {
  const State& s = Get();
  if (!s.available.ok()) return s.available;
  return s.devices;
}

std::string HipLibraryDescription() {
  const State& s = Get();
  return s.lib != nullptr ? s.lib->description : "";
}

absl::StatusOr<HipAbi> HipAbiFor(int runtime_version) {
  HipAbi abi;
  abi.runtime_version = runtime_version;
  abi.major = runtime_version / kMajorScale;
  abi.minor = (runtime_version % kMajorScale) / kMinorScale;
  if (runtime_version <= 0 || abi.major < kHipOldestMajor || abi.major > kHipNewestMajor) {
    return absl::FailedPreconditionError(absl::StrCat(
        "HIP runtime version ", runtime_version, " (ROCm ", abi.major, ".", abi.minor,
        ") is not one this build knows (ROCm ", kHipOldestMajor, ".x to ", kHipNewestMajor,
        ".x): values that differ between ROCm majors (hipMemoryType, the IPC open flag, copy kinds) would be guessed; "
        "name a libamdhip64 of a known major (DMAGATHER_HIP_LIB; dmagatherd --hip_lib), or use a dmagather that "
        "knows this one"));
  }
  const bool six = abi.major >= 6;
  abi.memory_type_device = six ? 2 : 1;
  abi.ipc_lazy_enable_peer_access = six ? 1 : 0;
  if (abi.major > 6 || (abi.major == 6 && abi.minor >= 1)) {
    abi.d2d_kind = 1024;
    abi.d2d_kind_name = "hipMemcpyDeviceToDeviceNoCU";
  }
  // 7.0 no longer checks streams in hipStreamGetFlags and has no
  // hipStreamGetId yet (new in 7.1); its hipStreamGetDevice still checks.
  if (abi.major >= 7) {
    abi.stream_check = (abi.major > 7 || abi.minor >= 1) ? StreamCheck::kGetId : StreamCheck::kGetDevice;
  }
  return abi;
}

std::vector<std::string> HipLibraryCandidates() {
  if (const std::optional<std::string> set = HipLibrarySet(); set.has_value()) {
    if (!set->empty()) return {*set};
  } else if (const char* lib = std::getenv("DMAGATHER_HIP_LIB"); lib != nullptr && *lib != '\0') {
    return {lib};
  }
  std::vector<std::string> names;
  for (int major = kHipNewestMajor; major >= kHipOldestMajor; --major) {
    names.push_back(absl::StrCat("libamdhip64.so.", major));
  }
  return names;
}

void* OpenFirstLibrary(const std::vector<std::string>& candidates, std::string* path, std::string* tried) {
  for (const std::string& c : candidates) {
    if (void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL); lib != nullptr) {
      *path = c;
      return lib;
    }
    const char* why = dlerror();
    absl::StrAppend(tried, tried->empty() ? "" : "; ", why != nullptr ? why : c + ": dlopen failed");
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<HipLibrary>> LoadHip(const std::vector<std::string>& candidates) {
  std::string path;
  std::string tried;
  void* lib = OpenFirstLibrary(candidates, &path, &tried);
  if (lib == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot load libamdhip64 (the HIP runtime of ROCm ", kHipOldestMajor,
                                               ".x to ", kHipNewestMajor, ".x; this build's HIP headers are ",
                                               kHeaderMajor, ".", HIP_VERSION_MINOR, "): ", tried));
  }
  auto out = std::make_unique<HipLibrary>();
  out->path = path;
  const std::string name = Basename(path);
  std::string missing;
  HipApi& a = out->api;
  Resolve(lib, "hipGetDeviceCount", &a.hipGetDeviceCount, &missing);
  Resolve(lib, "hipGetDevice", &a.hipGetDevice, &missing);
  Resolve(lib, "hipSetDevice", &a.hipSetDevice, &missing);
  Resolve(lib, "hipRuntimeGetVersion", &a.hipRuntimeGetVersion, &missing);
  Resolve(lib, "hipGetLastError", &a.hipGetLastError, &missing);
  Resolve(lib, "hipGetErrorName", &a.hipGetErrorName, &missing);
  Resolve(lib, "hipGetErrorString", &a.hipGetErrorString, &missing);
  Resolve(lib, "hipDeviceGetUuid", &a.hipDeviceGetUuid, &missing);
  Resolve(lib, "hipDeviceGetPCIBusId", &a.hipDeviceGetPCIBusId, &missing);
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
  Resolve(lib, "hipStreamGetFlags", &a.hipStreamGetFlags, &missing);
  if (!missing.empty()) {
    dlclose(lib);
    return absl::UnavailableError(absl::StrCat(name, " lacks ", missing));
  }
  int version = 0;
  hipError_t err = a.hipRuntimeGetVersion(&version);
  (void)a.hipGetLastError();
  if (err != hipSuccess) {
    absl::Status st = MakeStatus(a, "hipRuntimeGetVersion", err);
    dlclose(lib);
    return absl::UnavailableError(absl::StrCat(name, ": ", st.message()));
  }
  auto abi = HipAbiFor(version);
  if (!abi.ok()) {
    dlclose(lib);
    return absl::UnavailableError(absl::StrCat(name, ": ", abi.status().message()));
  }
  a.abi = *abi;
  if (a.abi.stream_check == StreamCheck::kGetId) {
    Resolve(lib, "hipStreamGetId", &a.hipStreamGetId, &missing);
  } else if (a.abi.stream_check == StreamCheck::kGetDevice) {
    Resolve(lib, "hipStreamGetDevice", &a.hipStreamGetDevice, &missing);
  }
  if (!missing.empty()) {
    dlclose(lib);
    return absl::UnavailableError(absl::StrCat(name, " (HIP runtime ", version, ") lacks ", missing,
                                               ", which checks streams on ROCm ", a.abi.major, ".", a.abi.minor));
  }
  out->description = absl::StrCat(name, " (HIP runtime ", version, ", ROCm ", a.abi.major, ".", a.abi.minor, ")");
  return out;
}

}  // namespace dmagather::common::hip

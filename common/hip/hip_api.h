// The HIP edge shared by dmagatherd's hip runtime and libdmagather's hip
// client backend. libamdhip64 is not linked: it is opened with dlopen on
// first use (the soname of the HIP major version the headers describe,
// libamdhip64.so.<HIP_VERSION_MAJOR>), so every binary built with HIP still
// starts on a node without ROCm, and a node with another ROCm major (whose
// ABI differs: hipMemoryType was renumbered in 6.0) is refused with a
// reason instead of misread. HIP errors become absl::Status once, here,
// naming the call and the code.
//
// On a machine with libamdhip64 but no AMD GPU (no /dev/kfd, no amdgpu
// driver), hipGetDeviceCount returns hipErrorNoDevice at once: HipAvailable()
// says so (UNAVAILABLE). Checked on Debian 12 (HIP 5.2.3) without ROCm
// kernel driver: no crash, no hang, ~20 ms.
//
// Threads: everything here is thread-safe; the library is opened and the
// functions resolved once (first caller) and immutable after.
#pragma once

#include <hip/hip_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dmagather::common::hip {

// The HIP functions dmagather calls, resolved from libamdhip64 by dlsym.
struct HipApi {
  hipError_t (*hipGetDeviceCount)(int*) = nullptr;
  hipError_t (*hipGetDevice)(int*) = nullptr;
  hipError_t (*hipSetDevice)(int) = nullptr;
  hipError_t (*hipRuntimeGetVersion)(int*) = nullptr;
  hipError_t (*hipGetLastError)() = nullptr;
  const char* (*hipGetErrorName)(hipError_t) = nullptr;
  const char* (*hipGetErrorString)(hipError_t) = nullptr;
  hipError_t (*hipDeviceCanAccessPeer)(int*, int, int) = nullptr;
  hipError_t (*hipDeviceEnablePeerAccess)(int, unsigned int) = nullptr;
  hipError_t (*hipStreamCreateWithFlags)(hipStream_t*, unsigned int) = nullptr;
  hipError_t (*hipStreamDestroy)(hipStream_t) = nullptr;
  hipError_t (*hipEventCreateWithFlags)(hipEvent_t*, unsigned) = nullptr;
  hipError_t (*hipEventDestroy)(hipEvent_t) = nullptr;
  hipError_t (*hipEventRecord)(hipEvent_t, hipStream_t) = nullptr;
  hipError_t (*hipEventQuery)(hipEvent_t) = nullptr;
  hipError_t (*hipStreamWaitEvent)(hipStream_t, hipEvent_t, unsigned int) = nullptr;
  hipError_t (*hipHostRegister)(void*, size_t, unsigned int) = nullptr;
  hipError_t (*hipHostUnregister)(void*) = nullptr;
  hipError_t (*hipHostGetDevicePointer)(void**, void*, unsigned int) = nullptr;
  hipError_t (*hipIpcGetMemHandle)(hipIpcMemHandle_t*, void*) = nullptr;
  hipError_t (*hipIpcOpenMemHandle)(void**, hipIpcMemHandle_t, unsigned int) = nullptr;
  hipError_t (*hipIpcCloseMemHandle)(void*) = nullptr;
  hipError_t (*hipMemGetAddressRange)(hipDeviceptr_t*, size_t*, hipDeviceptr_t) = nullptr;
  hipError_t (*hipPointerGetAttribute)(void*, hipPointer_attribute, hipDeviceptr_t) = nullptr;
  hipError_t (*hipMalloc)(void**, size_t) = nullptr;
  hipError_t (*hipFree)(void*) = nullptr;
  hipError_t (*hipMemcpyAsync)(void*, const void*, size_t, hipMemcpyKind, hipStream_t) = nullptr;
  hipError_t (*hipStreamWriteValue32)(hipStream_t, void*, uint32_t, unsigned int) = nullptr;
  hipError_t (*hipStreamWaitValue32)(hipStream_t, void*, uint32_t, unsigned int, uint32_t) = nullptr;
};

// "hipIpcOpenMemHandle: hipErrorInvalidValue (invalid argument)".
absl::Status HipStatus(const char* call, hipError_t err);

#define DMAG_HIP_RETURN_IF_ERROR(api, call)                                   \
  do {                                                                        \
    hipError_t dmag_hip_err_ = (api)->call;                                   \
    if (dmag_hip_err_ != hipSuccess) {                                        \
      return ::dmagather::common::hip::HipStatus(#call, dmag_hip_err_);       \
    }                                                                         \
  } while (0)

// The library and its functions; an error (UNAVAILABLE) when libamdhip64
// of this HIP major cannot be opened or lacks a function.
absl::StatusOr<const HipApi*> Hip();

// OK with the number of devices (>= 1), or why HIP cannot be used here
// (no library, no device: UNAVAILABLE). Cheap after the first call.
absl::StatusOr<int> HipAvailable();

// Which library was opened and its runtime version, for logs ("" if none).
std::string HipLibraryDescription();

}  // namespace dmagather::common::hip

// The HIP edge shared by dmagatherd's hip runtime and libdmagather's hip
// client backend. libamdhip64 is not linked: it is opened with dlopen on
// first use, so every binary built with HIP still starts on a node without
// ROCm. One binary serves ROCm 5.x, 6.x and 7.x (the way NCCL serves CUDA
// drivers): the library is found by soname, newest first
// (libamdhip64.so.7, .so.6, .so.5; $DMAGATHER_HIP_LIB in a rank,
// dmagatherd's --hip_lib, names one file instead), its hipRuntimeGetVersion picks the values that differ between
// majors (HipAbi: hipMemoryType renumbered in 6.0, the IPC open flag,
// hipMemcpyDeviceToDeviceNoCU from 6.1, how a stream is checked), and a
// major this build does not know is refused with the reason. The headers
// the build used only have to agree with these values on the calls'
// prototypes (32 of them, and the stream check's call on 7.x, unchanged
// from 5.2 to 7.x where the headers have them); hip_api.cc checks at
// compile time that the table matches the headers it is built against and
// that HipApi's function types are the headers' prototypes.
// HIP errors become absl::Status once, here, naming the call and the code.
//
// On a machine with libamdhip64 but no AMD GPU (no /dev/kfd, no amdgpu
// driver), hipGetDeviceCount returns hipErrorNoDevice at once: HipAvailable()
// says so (UNAVAILABLE). Checked on Debian 12 (HIP 5.2.3) without ROCm
// kernel driver: no crash, no hang, ~20 ms.
//
// Threads: everything here is thread-safe; the library is opened and the
// functions resolved once (first caller) and immutable after. LoadHip (for
// tests and tools) opens a library of its own each call.
#pragma once

#include <hip/hip_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dmagather::common::hip {

// hipStreamGetId (ROCm >= 7.1: not in 7.0's library nor in older headers):
// a 64-bit id of a stream, after checking that the stream exists.
using HipStreamGetIdFn = hipError_t (*)(hipStream_t, unsigned long long*);
// hipStreamGetDevice (not in 5.2's headers): the device of a stream, after
// checking that the stream exists (ROCm 7.0 kept that check).
using HipStreamGetDeviceFn = hipError_t (*)(hipStream_t, hipDevice_t*);

// How a caller's stream handle is checked before it is used: ROCm 7.0
// dereferences an invalid stream in hipMemcpyAsync/hipEventRecord (and in
// hipStreamGetFlags), where 5.x/6.x returned an error.
enum class StreamCheck {
  kGetFlags,   // 5.x, 6.x: hipStreamGetFlags checks the handle (hipErrorContextIsDestroyed).
  kGetDevice,  // 7.0: hipStreamGetDevice checks it (hipErrorContextIsDestroyed); no hipStreamGetId yet.
  kGetId,      // 7.1 and later 7.x: hipStreamGetId checks it (hipErrorInvalidResourceHandle).
};

// The values that differ between ROCm majors, chosen at run time from
// hipRuntimeGetVersion (never from the headers the build used).
struct HipAbi {
  int runtime_version = 0;  // As hipRuntimeGetVersion: major * 10^7 + minor * 10^5 + patch.
  int major = 0;
  int minor = 0;
  // hipPointerGetAttribute(HIP_POINTER_ATTRIBUTE_MEMORY_TYPE) of device
  // memory: hipMemoryTypeDevice, 1 before 6.0, 2 from 6.0.
  unsigned int memory_type_device = 0;
  // hipIpcOpenMemHandle's flag: hipIpcMemLazyEnablePeerAccess, 0 before 6.0,
  // 1 from 6.0 (clr >= 5.7 rejects every other value).
  unsigned int ipc_lazy_enable_peer_access = 0;
  // The daemon's device-to-device copy kind: hipMemcpyDeviceToDeviceNoCU
  // (1024) from 6.1, else hipMemcpyDeviceToDevice (3). An int: 1024 is not
  // an enumerator of older headers (cast at the call).
  int d2d_kind = 3;
  const char* d2d_kind_name = "hipMemcpyDeviceToDevice";
  StreamCheck stream_check = StreamCheck::kGetFlags;
};

// The ROCm majors this build knows.
inline constexpr int kHipOldestMajor = 5;
inline constexpr int kHipNewestMajor = 7;

// The table for a runtime version (hipRuntimeGetVersion's value); an error
// (FAILED_PRECONDITION, with the reason) for a major outside 5..7.
absl::StatusOr<HipAbi> HipAbiFor(int runtime_version);

// The HIP functions dmagather calls, resolved from libamdhip64 by dlsym.
struct HipApi {
  hipError_t (*hipGetDeviceCount)(int*) = nullptr;
  hipError_t (*hipGetDevice)(int*) = nullptr;
  hipError_t (*hipSetDevice)(int) = nullptr;
  hipError_t (*hipRuntimeGetVersion)(int*) = nullptr;
  hipError_t (*hipGetLastError)() = nullptr;
  const char* (*hipGetErrorName)(hipError_t) = nullptr;
  const char* (*hipGetErrorString)(hipError_t) = nullptr;
  hipError_t (*hipDeviceGetUuid)(hipUUID*, hipDevice_t) = nullptr;
  hipError_t (*hipDeviceGetPCIBusId)(char*, int, int) = nullptr;
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
  hipError_t (*hipStreamGetFlags)(hipStream_t, unsigned int*) = nullptr;
  HipStreamGetIdFn hipStreamGetId = nullptr;          // Resolved where abi.stream_check is kGetId.
  HipStreamGetDeviceFn hipStreamGetDevice = nullptr;  // Resolved where abi.stream_check is kGetDevice.

  // The library's version and its values (HipAbiFor).
  HipAbi abi;
};

// "hipIpcOpenMemHandle: hipErrorInvalidValue (invalid argument)".
absl::Status HipStatus(const char* call, hipError_t err);

#define DMAG_HIP_RETURN_IF_ERROR(api, call)                             \
  do {                                                                  \
    hipError_t dmag_hip_err_ = (api)->call;                             \
    if (dmag_hip_err_ != hipSuccess) {                                  \
      return ::dmagather::common::hip::HipStatus(#call, dmag_hip_err_); \
    }                                                                   \
  } while (0)

// The library and its functions; an error (UNAVAILABLE) when no
// libamdhip64 can be opened, it lacks a function, or its major is unknown.
absl::StatusOr<const HipApi*> Hip();

// The files tried, in order: the file the process named (SetHipLibrary,
// hip_library.h: dmagatherd's --hip_lib) or, where it named none,
// $DMAGATHER_HIP_LIB alone when set; else libamdhip64.so.7, .so.6, .so.5
// (newest first, by soname).
std::vector<std::string> HipLibraryCandidates();

// A library opened by LoadHip: its functions and which file it was.
struct HipLibrary {
  HipApi api;
  std::string path;         // The candidate that opened.
  std::string description;  // "libamdhip64.so.6 (HIP runtime 60342131, ROCm 6.3)".
};

// Opens the first candidate that loads, resolves the functions and maps its
// version. What Hip() does once; tests call it with their own candidates.
absl::StatusOr<std::unique_ptr<HipLibrary>> LoadHip(const std::vector<std::string>& candidates);

// dlopen (RTLD_NOW | RTLD_LOCAL) of the first of `candidates` that loads: its
// handle, and its name in *path; nullptr when none does, every dlerror in
// *tried. For the ROCm libraries found by soname, newest first.
void* OpenFirstLibrary(const std::vector<std::string>& candidates, std::string* path, std::string* tried);

// OK with the number of devices (>= 1), or why HIP cannot be used here
// (no library, no device: UNAVAILABLE). Cheap after the first call.
absl::StatusOr<int> HipAvailable();

// Which library was opened and its runtime version, for logs ("" if none).
std::string HipLibraryDescription();

}  // namespace dmagather::common::hip

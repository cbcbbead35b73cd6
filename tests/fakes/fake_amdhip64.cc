// A fake libamdhip64 for unit tests on machines without ROCm: the HIP
// functions dmagather resolves, answering as the HIP runtime of the ROCm
// version in $DMAGATHER_FAKE_HIP_VERSION (hipRuntimeGetVersion's encoding,
// default 60342131 = 6.3) would, in the few ways that differ between majors:
//  - hipPointerGetAttribute(MEMORY_TYPE) of hipMalloc memory: 1 before 6.0,
//    2 from 6.0 (hipMemoryTypeDevice was renumbered);
//  - hipIpcOpenMemHandle accepts only hipIpcMemLazyEnablePeerAccess of its
//    major (0 before 6.0, 1 after), as clr >= 5.7 does;
//  - a stream handle that is not a live stream: an error from
//    hipMemcpyAsync/hipEventRecord/hipStreamGetFlags before 7.0; from 7.0
//    these dereference it (here: abort(), so a test that reaches them dies);
//    hipStreamGetId (7.1 on) returns hipErrorInvalidResourceHandle and
//    hipStreamGetDevice (6.x, 7.x) hipErrorContextIsDestroyed. Built with
//    FAKE_HIP_NO_STREAM_GET_ID it lacks hipStreamGetId, as ROCm 7.0's
//    library does (libfake_amdhip64_rocm70.so).
// One device ($DMAGATHER_FAKE_HIP_DEVICES for more, each a peer of the
// others), memory from malloc, copies done at once with memcpy.
// fake_hip_* (extern "C") let tests read what was asked of it.
//
// Threads: any; a mutex guards the state.
#include <hip/hip_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

namespace {

std::mutex mu;
std::set<void*> streams;
std::set<void*> events;
std::map<uintptr_t, size_t> allocations;  // hipMalloc's: base -> bytes.

// The allocation holding `p` (its base), or 0.
uintptr_t Holding(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = allocations.upper_bound(a);
  if (it == allocations.begin()) return 0;
  --it;
  return a < it->first + it->second ? it->first : 0;
}
int last_memcpy_kind = -1;
unsigned int last_ipc_flags = ~0u;
hipError_t last_error = hipSuccess;

int Version() {
  const char* v = std::getenv("DMAGATHER_FAKE_HIP_VERSION");
  return v != nullptr ? std::atoi(v) : 60342131;
}
int Major() { return Version() / 10000000; }
int Devices() {
  const char* v = std::getenv("DMAGATHER_FAKE_HIP_DEVICES");
  return v != nullptr ? std::atoi(v) : 1;
}

hipError_t Fail(hipError_t e) {
  last_error = e;
  return e;
}

// As clr's hip::isValid: null, hipStreamLegacy (1), hipStreamPerThread (2) and live streams.
bool StreamValid(hipStream_t s) {
  const auto v = reinterpret_cast<uintptr_t>(s);
  return v == 0 || v == 1 || v == 2 || streams.count(s) != 0;
}

// What the runtime does with a stream it uses without checking first.
hipError_t UseStream(hipStream_t s) {
  if (StreamValid(s)) return hipSuccess;
  if (Major() >= 7) std::abort();  // ROCm 7.0: the handle is dereferenced.
  return Fail(hipErrorContextIsDestroyed);
}

}  // namespace

extern "C" {

int fake_hip_last_memcpy_kind() { return last_memcpy_kind; }
unsigned int fake_hip_last_ipc_flags() { return last_ipc_flags; }

hipError_t hipRuntimeGetVersion(int* v) {
  *v = Version();
  return hipSuccess;
}
hipError_t hipGetDeviceCount(int* n) {
  *n = Devices();
  return hipSuccess;
}
hipError_t hipGetDevice(int* d) {
  *d = 0;
  return hipSuccess;
}
hipError_t hipSetDevice(int d) { return d >= 0 && d < Devices() ? hipSuccess : Fail(hipErrorInvalidDevice); }
hipError_t hipGetLastError() {
  std::lock_guard<std::mutex> l(mu);
  hipError_t e = last_error;
  last_error = hipSuccess;
  return e;
}
const char* hipGetErrorName(hipError_t e) {
  switch (e) {
    case hipSuccess:
      return "hipSuccess";
    case hipErrorInvalidValue:
      return "hipErrorInvalidValue";
    case hipErrorInvalidResourceHandle:
      return "hipErrorInvalidResourceHandle";
    case hipErrorContextIsDestroyed:
      return "hipErrorContextIsDestroyed";
    default:
      return "hipErrorUnknown";
  }
}
const char* hipGetErrorString(hipError_t) { return "fake"; }
hipError_t hipDeviceGetUuid(hipUUID* uuid, hipDevice_t device) {
  std::memset(uuid->bytes, 0, sizeof(uuid->bytes));
  uuid->bytes[0] = 0x48;
  uuid->bytes[15] = static_cast<char>(device);
  return hipSuccess;
}
hipError_t hipDeviceGetPCIBusId(char* bus, int len, int device) {
  std::snprintf(bus, len, "0000:%02x:00.0", 0x40 + device);
  return hipSuccess;
}
hipError_t hipDeviceCanAccessPeer(int* can, int a, int b) {
  *can = a != b && a < Devices() && b < Devices();
  return hipSuccess;
}
hipError_t hipDeviceEnablePeerAccess(int, unsigned int) { return hipSuccess; }

hipError_t hipStreamCreateWithFlags(hipStream_t* s, unsigned int) {
  std::lock_guard<std::mutex> l(mu);
  *s = reinterpret_cast<hipStream_t>(new char[16]);
  streams.insert(*s);
  return hipSuccess;
}
hipError_t hipStreamDestroy(hipStream_t s) {
  std::lock_guard<std::mutex> l(mu);
  if (streams.erase(s) == 0) return Fail(hipErrorInvalidResourceHandle);
  delete[] reinterpret_cast<char*>(s);
  return hipSuccess;
}
hipError_t hipStreamGetFlags(hipStream_t s, unsigned int* flags) {
  std::lock_guard<std::mutex> l(mu);
  if (s == nullptr || flags == nullptr) return Fail(hipErrorInvalidValue);
  if (Major() >= 7) {
    if (!StreamValid(s)) std::abort();  // 7.x: no check, the handle is read.
  } else if (!StreamValid(s)) {
    return Fail(hipErrorContextIsDestroyed);
  }
  *flags = 0;
  return hipSuccess;
}
#ifndef FAKE_HIP_NO_STREAM_GET_ID
hipError_t hipStreamGetId(hipStream_t s, unsigned long long* id) {
  std::lock_guard<std::mutex> l(mu);
  if (id == nullptr) return Fail(hipErrorInvalidValue);
  if (!StreamValid(s)) return Fail(hipErrorInvalidResourceHandle);
  *id = reinterpret_cast<uintptr_t>(s);
  return hipSuccess;
}
#endif
// As clr from 6.0 to 7.x: the one stream query that still checks the handle on 7.0.
hipError_t hipStreamGetDevice(hipStream_t s, hipDevice_t* device) {
  std::lock_guard<std::mutex> l(mu);
  if (device == nullptr) return Fail(hipErrorInvalidValue);
  if (!StreamValid(s)) return Fail(hipErrorContextIsDestroyed);
  *device = 0;
  return hipSuccess;
}

hipError_t hipEventCreateWithFlags(hipEvent_t* e, unsigned) {
  std::lock_guard<std::mutex> l(mu);
  *e = reinterpret_cast<hipEvent_t>(new char[16]);
  events.insert(*e);
  return hipSuccess;
}
hipError_t hipEventDestroy(hipEvent_t e) {
  std::lock_guard<std::mutex> l(mu);
  if (events.erase(e) == 0) return Fail(hipErrorInvalidResourceHandle);
  delete[] reinterpret_cast<char*>(e);
  return hipSuccess;
}
hipError_t hipEventRecord(hipEvent_t e, hipStream_t s) {
  std::lock_guard<std::mutex> l(mu);
  if (events.count(e) == 0) return Fail(hipErrorInvalidResourceHandle);
  return UseStream(s);
}
hipError_t hipEventQuery(hipEvent_t) { return hipSuccess; }
hipError_t hipStreamWaitEvent(hipStream_t s, hipEvent_t, unsigned int) {
  std::lock_guard<std::mutex> l(mu);
  return UseStream(s);
}

hipError_t hipHostRegister(void*, size_t, unsigned int) { return hipSuccess; }
hipError_t hipHostUnregister(void*) { return hipSuccess; }
hipError_t hipHostGetDevicePointer(void** dev, void* host, unsigned int) {
  *dev = host;
  return hipSuccess;
}

hipError_t hipMalloc(void** p, size_t bytes) {
  std::lock_guard<std::mutex> l(mu);
  *p = std::malloc(bytes);
  allocations[reinterpret_cast<uintptr_t>(*p)] = bytes;
  return hipSuccess;
}
hipError_t hipFree(void* p) {
  std::lock_guard<std::mutex> l(mu);
  if (allocations.erase(reinterpret_cast<uintptr_t>(p)) == 0) return Fail(hipErrorInvalidValue);
  std::free(p);
  return hipSuccess;
}
hipError_t hipMemGetAddressRange(hipDeviceptr_t* base, size_t* size, hipDeviceptr_t p) {
  std::lock_guard<std::mutex> l(mu);
  if (const uintptr_t b = Holding(p); b != 0) {
    *base = reinterpret_cast<void*>(b);
    *size = allocations[b];
    return hipSuccess;
  }
  *base = p;  // Not hipMalloc's: 1 MiB from p.
  *size = 1 << 20;
  return hipSuccess;
}
hipError_t hipPointerGetAttribute(void* data, hipPointer_attribute attr, hipDeviceptr_t p) {
  std::lock_guard<std::mutex> l(mu);
  const uintptr_t base = Holding(p);  // Any address inside an allocation, as ROCm.
  if (base == 0) return Fail(hipErrorInvalidValue);
  switch (attr) {
    case HIP_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned int*>(data) = Major() >= 6 ? 2 : 1;
      return hipSuccess;
    case HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = 0;
      return hipSuccess;
    case HIP_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = base;
      return hipSuccess;
    default:
      return Fail(hipErrorInvalidValue);
  }
}
hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t* h, void* p) {
  std::memset(h, 0, sizeof(*h));
  std::memcpy(h, &p, sizeof(p));
  return hipSuccess;
}
hipError_t hipIpcOpenMemHandle(void** p, hipIpcMemHandle_t h, unsigned int flags) {
  std::lock_guard<std::mutex> l(mu);
  last_ipc_flags = flags;
  // clr >= 5.7: "if (flags != hipIpcMemLazyEnablePeerAccess) return hipErrorInvalidValue".
  if (flags != (Major() >= 6 ? 1u : 0u)) return Fail(hipErrorInvalidValue);
  std::memcpy(p, &h, sizeof(*p));
  return hipSuccess;
}
hipError_t hipIpcCloseMemHandle(void*) { return hipSuccess; }
hipError_t hipMemcpyAsync(void* dst, const void* src, size_t bytes, hipMemcpyKind kind, hipStream_t s) {
  {
    std::lock_guard<std::mutex> l(mu);
    last_memcpy_kind = static_cast<int>(kind);
    if (hipError_t e = UseStream(s); e != hipSuccess) return e;
  }
  std::memcpy(dst, src, bytes);
  return hipSuccess;
}
hipError_t hipStreamWriteValue32(hipStream_t s, void* p, uint32_t v, unsigned int) {
  std::lock_guard<std::mutex> l(mu);
  if (hipError_t e = UseStream(s); e != hipSuccess) return e;
  *static_cast<uint32_t*>(p) = v;
  return hipSuccess;
}
hipError_t hipStreamWaitValue32(hipStream_t s, void*, uint32_t, unsigned int, uint32_t) {
  std::lock_guard<std::mutex> l(mu);
  return UseStream(s);
}

}  // extern "C"

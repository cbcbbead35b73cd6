// The hip GpuRuntime: the GPU engine's calls on HIP (libamdhip64, opened
// with dlopen by common/hip/hip_api.h, so dmagatherd starts without ROCm),
// for AMD GPUs, whose copy engines are the SDMA engines. NOT YET RUN ON AMD
// HARDWARE: it builds against Debian 12's HIP 5.2.3 and is exercised here
// only up to "no device" (hipGetDeviceCount: hipErrorNoDevice).
//
//  - Ready gating on the CPU (device_waits() false). ROCm implements
//    hipStreamWaitValue32 on ordinary memory - the ranks' ready flags live in
//    their shared segments, not in hipMallocSignalMemory - as a blit kernel
//    that spins on the flag, and IPC events are waited the same way; the
//    daemon launches no kernel (docs/MEASUREMENTS.md), so the engine waits
//    for every rank's ready flag on the CPU and only then issues the op's
//    copies (docs/AMD.md).
//  - Copies: the SDMA engines, at most 128 MiB per transfer
//    (kHipMaxTransferBytes). ROCm moves copies between GPUs on SDMA engines
//    while SDMA is enabled (HSA_ENABLE_SDMA unset or 1); with
//    HSA_ENABLE_SDMA=0 it would use blit kernels, and with
//    GPU_FORCE_BLIT_COPY_SIZE=N it would for copies up to N KiB, so this
//    runtime refuses to start with either. Two ways, chosen at start:
//     * dmagatherd assigns the engines (--hip_engines=own, the default),
//       where libhsa-runtime64 has hsa_amd_memory_async_copy_on_engine
//       and hsa_amd_memory_copy_engine_status (ROCm >= 5.7) and the HIP
//       devices match HSA agents by PCI address: a fixed engine per peer
//       link among those the driver reports usable, minus
//       --hip_skip_engines (hex mask), copies through HSA with
//       signal completions (hsa_api.h, hsa_streams.h); bytes per engine in
//       CopyEngineCounters.
//     * otherwise (or --hip_engines=rocr) ROCr chooses: the reason
//       is logged and every copy is a hipMemcpyAsync on non-blocking
//       streams. The copy kind is chosen from the runtime's version
//       (common/hip HipAbi), not from the build's headers:
//       hipMemcpyDeviceToDeviceNoCU where the runtime has it (ROCm >= 6.1;
//       a 6.0 runtime would take 1024 as a plain copy), else
//       hipMemcpyDeviceToDevice. In clr (6.3) NoCU only changes
//       same-device copies that touch no IPC memory (an SDMA preference);
//       copies touching IPC-opened memory and copies between GPUs - all
//       the daemon issues - already go to SDMA.
//  - Completion: an end event per op and device (hipEventQuery), recorded
//    without hipEventDisableSystemFence, so its release is system-scope;
//    with engines assigned, the HSA completion signals of the op's copies
//    (an SDMA copy's signal is written after its data, and the rank's
//    event record after its done wait acquires at system scope, as
//    docs/AMD.md argues for hipMemcpyAsync).
//  - Imports: HIP IPC handles of allocation bases (hipIpcOpenMemHandle; size
//    from hipMemGetAddressRange).
// CreateHipRuntime (hip_runtime.h) makes it; register.cc registers
// --backend=hip with it.
//
// Threads: as runtime.h.
#include "server/engines/gpu/hip/hip_runtime.h"

#include <glog/logging.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hip/hip_api.h"
#include "common/memory_kinds.h"
#include "common/status.h"
#include "server/engines/factory.h"
#include "server/engines/gpu/hip/hsa_api.h"
#include "server/engines/gpu/hip/hsa_streams.h"
#include "server/engines/gpu/runtime.h"

namespace dmagather::server::engines::gpu::hip {
namespace {

using ::dmagather::common::hip::HipApi;
using ::dmagather::common::hip::HipStatus;

// Engines chosen by dmagatherd through hsa-runtime, or why ROCr chooses.
struct EngineChoice {
  std::unique_ptr<HsaLibrary> hsa;
  std::unique_ptr<HsaStreams> streams;  // Null: ROCr's choice (hipMemcpyAsync).
  std::string why_rocr;
};

EngineChoice ChooseEngines(const HipApi* api, int n, const HipEngineOptions& o) {
  EngineChoice c;
  const std::string& m = o.engines;
  if (m == "rocr") {
    c.why_rocr = "--hip_engines=rocr";
    return c;
  }
  if (!m.empty() && m != "own") {
    c.why_rocr = absl::StrCat("--hip_engines=", m, " is neither own nor rocr");
    return c;
  }
  if (n < 2) {
    c.why_rocr = "one device: no peer link to give an engine";
    return c;
  }
  absl::StatusOr<uint32_t> skip = ParseEngineMask(o.skip_engines);
  if (!skip.ok()) {
    c.why_rocr = absl::StrCat("--hip_skip_engines: ", skip.status().message());
    return c;
  }
  absl::StatusOr<std::unique_ptr<HsaLibrary>> lib = LoadHsa(HsaLibraryCandidates(o.hsa_lib));
  if (!lib.ok()) {
    c.why_rocr = std::string(lib.status().message());
    return c;
  }
  c.hsa = *std::move(lib);
  if (!c.hsa->no_engine_choice.empty()) {
    c.why_rocr = c.hsa->no_engine_choice;
    return c;
  }
  // clr has initialized HSA already; this takes a reference of our own.
  if (hsa_status_t st = c.hsa->api.init(); st != HSA_STATUS_SUCCESS) {
    c.why_rocr = absl::StrCat("hsa_init: HSA status ", int(st));
    return c;
  }
  std::vector<std::string> bus_ids;
  for (int d = 0; d < n; ++d) {
    char bus[32] = {0};
    hipError_t err = api->hipDeviceGetPCIBusId(bus, sizeof(bus), d);
    if (err != hipSuccess) {
      (void)api->hipGetLastError();
      c.why_rocr = std::string(HipStatus(absl::StrCat("hipDeviceGetPCIBusId(", d, ")").c_str(), err).message());
      return c;
    }
    bus_ids.push_back(bus);
  }
  absl::StatusOr<std::unique_ptr<HsaStreams>> streams = OwnSdmaEngines(&c.hsa->api, bus_ids, *skip);
  if (!streams.ok()) {
    c.why_rocr = std::string(streams.status().message());
    return c;
  }
  c.streams = *std::move(streams);
  return c;
}

class HipRuntime : public GpuRuntime {
 public:
  // Fails (Unavailable) without libamdhip64 or without an AMD GPU, and
  // (FailedPrecondition) when SDMA is disabled.
  static absl::StatusOr<std::unique_ptr<GpuRuntime>> Create(const HipEngineOptions& options) {
    DMAG_ASSIGN_OR_RETURN(const HipApi* api, ::dmagather::common::hip::Hip());
    DMAG_ASSIGN_OR_RETURN(int n, ::dmagather::common::hip::HipAvailable());
    if (const char* sdma = std::getenv("HSA_ENABLE_SDMA"); sdma != nullptr && std::strcmp(sdma, "0") == 0) {
      return absl::FailedPreconditionError(
          "HSA_ENABLE_SDMA=0: ROCm would do the copies with blit kernels, and dmagatherd launches no kernel; "
          "unset it (or set it to 1) for dmagatherd");
    }
    // clr copies up to GPU_FORCE_BLIT_COPY_SIZE KiB with blit kernels, whatever the memory.
    if (const char* blit = std::getenv("GPU_FORCE_BLIT_COPY_SIZE"); blit != nullptr && std::atoll(blit) > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("GPU_FORCE_BLIT_COPY_SIZE=", blit,
                       ": ROCm would do copies up to that many KiB with blit kernels, and "
                       "dmagatherd launches no kernel; unset it for dmagatherd"));
    }
    EngineChoice engines = ChooseEngines(api, n, options);
    if (engines.streams != nullptr) {
      LOG(INFO) << "hip: SDMA engines assigned by dmagatherd through " << engines.hsa->path << ": "
                << engines.streams->plan().Describe();
    } else {
      LOG(INFO) << "hip: ROCr chooses the SDMA engines (hipMemcpyAsync): " << engines.why_rocr;
    }
    return std::unique_ptr<GpuRuntime>(new HipRuntime(api, n, std::move(engines)));
  }

  const char* name() const override { return "hip"; }
  const char* label() const override { return "HIP"; }
  const char* device_kind() const override { return "hip"; }
  const char* ipc_memory_kind() const override { return common::kMemoryHipIpc; }
  size_t ipc_handle_bytes() const override { return sizeof(hipIpcMemHandle_t); }
  int num_devices() const override { return num_devices_; }
  uint64_t max_transfer_bytes() const override { return kHipMaxTransferBytes; }
  uint64_t default_chunk_bytes() const override { return kHipDefaultChunkBytes; }
  bool device_waits() const override { return false; }
  std::string Describe() const override {
    const std::string engines =
        hsa() != nullptr
            ? absl::StrCat("SDMA engines assigned by dmagatherd (hsa_amd_memory_async_copy_on_engine: ",
                           hsa()->plan().assigned_links(), " link(s), ", hsa()->plan().shared_links(), " sharing)")
            : absl::StrCat(api_->abi.d2d_kind_name, ", SDMA engines chosen by ROCr (", engines_.why_rocr, ")");
    return absl::StrCat(::dmagather::common::hip::HipLibraryDescription(), ", ", engines, ", HSA_ENABLE_SDMA ",
                        std::getenv("HSA_ENABLE_SDMA") ? "set" : "unset");
  }
  std::vector<CopyEngineBytes> CopyEngineCounters() const override {
    return hsa() != nullptr ? hsa()->Counters() : std::vector<CopyEngineBytes>{};
  }

  absl::Status SetDevice(int device) override {
    DMAG_HIP_RETURN_IF_ERROR(api_, hipSetDevice(device));
    return absl::OkStatus();
  }
  absl::StatusOr<DeviceIdentity> Identify(int device) override {
    DeviceIdentity id;
    hipUUID uuid;
    DMAG_HIP_RETURN_IF_ERROR(api_, hipDeviceGetUuid(&uuid, device));
    id.uuid.assign(uuid.bytes, sizeof(uuid.bytes));
    char bus[32] = {0};
    if (api_->hipDeviceGetPCIBusId(bus, sizeof(bus), device) == hipSuccess) {
      id.pci_bus_id = bus;
    } else {
      (void)api_->hipGetLastError();
    }
    id.name = absl::StrCat("AMD GPU ", device);
    return id;
  }
  absl::StatusOr<bool> EnablePeerAccess(int a, int b) override {
    int can = 0;
    DMAG_HIP_RETURN_IF_ERROR(api_, hipDeviceCanAccessPeer(&can, a, b));
    if (!can) return false;
    DMAG_HIP_RETURN_IF_ERROR(api_, hipSetDevice(a));
    hipError_t err = api_->hipDeviceEnablePeerAccess(b, 0);
    if (err == hipErrorPeerAccessAlreadyEnabled) {
      (void)api_->hipGetLastError();
    } else if (err != hipSuccess) {
      (void)api_->hipGetLastError();
      return HipStatus(absl::StrCat("hipDeviceEnablePeerAccess(", a, "->", b, ")").c_str(), err);
    }
    return true;
  }
  absl::StatusOr<GpuStream> CreateStream(int device) override {
    if (hsa() != nullptr) return static_cast<GpuStream>(hsa()->CreateStream(device));
    DMAG_HIP_RETURN_IF_ERROR(api_, hipSetDevice(device));
    hipStream_t s = nullptr;
    DMAG_HIP_RETURN_IF_ERROR(api_, hipStreamCreateWithFlags(&s, hipStreamNonBlocking));
    return static_cast<GpuStream>(s);
  }
  void DestroyStream(int device, GpuStream s) override {
    if (hsa() != nullptr) return hsa()->DestroyStream(static_cast<HsaStreams::Stream*>(s));
    (void)api_->hipSetDevice(device);
    (void)api_->hipStreamDestroy(static_cast<hipStream_t>(s));
  }
  absl::StatusOr<GpuEvent> CreateEvent(int device) override {
    if (hsa() != nullptr) return static_cast<GpuEvent>(hsa()->CreateEvent());
    DMAG_HIP_RETURN_IF_ERROR(api_, hipSetDevice(device));
    hipEvent_t e = nullptr;
    // No hipEventDisableSystemFence: the record's release is system-scope.
    DMAG_HIP_RETURN_IF_ERROR(api_, hipEventCreateWithFlags(&e, hipEventDisableTiming));
    return static_cast<GpuEvent>(e);
  }
  void DestroyEvent(int device, GpuEvent e) override {
    if (hsa() != nullptr) return hsa()->DestroyEvent(static_cast<HsaStreams::Event*>(e));
    (void)api_->hipSetDevice(device);
    (void)api_->hipEventDestroy(static_cast<hipEvent_t>(e));
  }

  // The engine gates on the CPU (it reads the ready word in the daemon's
  // own mapping), so the device never reads the flags: nothing to register.
  absl::StatusOr<uint64_t> RegisterFlags(int device, void* pages, uint64_t bytes, const uint32_t* ready_word) override {
    (void)device;
    (void)pages;
    (void)bytes;
    (void)ready_word;
    return 0;
  }
  void UnregisterFlags(void* pages) override { (void)pages; }

  absl::StatusOr<IpcMapping> OpenIpc(int device, const std::string& h) override {
    DMAG_HIP_RETURN_IF_ERROR(api_, hipSetDevice(device));
    hipIpcMemHandle_t handle;
    std::memcpy(&handle, h.data(), sizeof(handle));
    void* p = nullptr;
    // hipIpcMemLazyEnablePeerAccess of the runtime's major (0 before 6.0, 1 after).
    DMAG_HIP_RETURN_IF_ERROR(api_, hipIpcOpenMemHandle(&p, handle, api_->abi.ipc_lazy_enable_peer_access));
    hipDeviceptr_t base = nullptr;
    size_t size = 0;
    hipError_t err = api_->hipMemGetAddressRange(&base, &size, p);
    if (err != hipSuccess) {
      (void)api_->hipIpcCloseMemHandle(p);
      return HipStatus("hipMemGetAddressRange", err);
    }
    if (base != p) {
      LOG(WARNING) << "hipIpcOpenMemHandle returned " << p << " inside an allocation at " << base
                   << ": using the returned pointer as the region's base";
    }
    return IpcMapping{static_cast<char*>(p), size - (static_cast<char*>(p) - static_cast<char*>(base))};
  }
  void CloseIpc(int device, char* base) override {
    (void)api_->hipSetDevice(device);
    hipError_t err = api_->hipIpcCloseMemHandle(base);
    if (err != hipSuccess) LOG(WARNING) << HipStatus("hipIpcCloseMemHandle", err).message();
  }

  absl::Status WaitValues(int, GpuStream, const uint64_t*, size_t, uint32_t) override {
    return absl::FailedPreconditionError("the hip runtime gates ops on the CPU (no stream waits in dmagatherd)");
  }
  absl::Status Copy(int device, GpuStream stream, const CopyCmd* chunks, size_t n, bool /*sole_stream*/) override {
    (void)device;
    if (hsa() != nullptr) return hsa()->Copy(static_cast<HsaStreams::Stream*>(stream), chunks, n);
    hipStream_t s = static_cast<hipStream_t>(stream);
    const auto kind = static_cast<hipMemcpyKind>(api_->abi.d2d_kind);
    for (size_t i = 0; i < n; ++i) {
      DMAG_HIP_RETURN_IF_ERROR(api_, hipMemcpyAsync(chunks[i].dst, chunks[i].src, chunks[i].bytes, kind, s));
    }
    return absl::OkStatus();
  }
  absl::Status RecordEvent(GpuEvent e, GpuStream s) override {
    if (hsa() != nullptr) return hsa()->Record(static_cast<HsaStreams::Event*>(e), static_cast<HsaStreams::Stream*>(s));
    DMAG_HIP_RETURN_IF_ERROR(api_, hipEventRecord(static_cast<hipEvent_t>(e), static_cast<hipStream_t>(s)));
    return absl::OkStatus();
  }
  absl::Status StreamWaitEvent(GpuStream s, GpuEvent e) override {
    if (hsa() != nullptr) return hsa()->Wait(static_cast<HsaStreams::Stream*>(s), static_cast<HsaStreams::Event*>(e));
    DMAG_HIP_RETURN_IF_ERROR(api_, hipStreamWaitEvent(static_cast<hipStream_t>(s), static_cast<hipEvent_t>(e), 0));
    return absl::OkStatus();
  }
  absl::StatusOr<bool> QueryEvent(GpuEvent e) override {
    if (hsa() != nullptr) return hsa()->Query(static_cast<HsaStreams::Event*>(e));
    hipError_t err = api_->hipEventQuery(static_cast<hipEvent_t>(e));
    if (err == hipSuccess) return true;
    if (err == hipErrorNotReady) return false;
    return HipStatus("hipEventQuery(end of op)", err);
  }

 private:
  HipRuntime(const HipApi* api, int n, EngineChoice engines)
      : api_(api), num_devices_(n), engines_(std::move(engines)) {}
  HsaStreams* hsa() const { return engines_.streams.get(); }

  const HipApi* const api_;
  const int num_devices_;
  EngineChoice engines_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuRuntime>> CreateHipRuntime(const HipEngineOptions& options) {
  return HipRuntime::Create(options);
}

}  // namespace dmagather::server::engines::gpu::hip

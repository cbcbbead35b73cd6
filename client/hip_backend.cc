// The hip client backend: the HIP side of a rank when dmagatherd runs the
// hip backend (AMD GPUs). The counterpart of cuda_backend.cc: describes
// device pointers (allocation base through hipMemGetAddressRange, size,
// buffer id, device) for the registration cache, exports HIP IPC handles of
// the base, and enqueues the stream side of a submit - the out-of-place
// self-shard copy (on SDMA from ROCm 6.1), the ready write, the done wait - with no host
// synchronisation. libamdhip64 is reached through dlopen (common/hip), so
// the library loads on nodes without ROCm. NOT YET RUN ON AMD HARDWARE.
//
// Ordering and visibility (docs/AMD.md): the daemon's SDMA copies write
// to memory, not through the consumer GPU's L2, and read their sources from
// memory. So
//  - WriteReady records an event (its release is system-scope: the
//    producer's L2 is written back) before hipStreamWriteValue32(ready);
//  - WaitDoneOnStream enqueues hipStreamWaitValue32(done >= seq) and then
//    records an event, whose barrier packet carries a system-scope acquire:
//    the consumer GPU's L2 is invalidated before the kernels that follow
//    read the gathered output (an L2 line cached before the copy - memory
//    the caching allocator handed out again - would otherwise be read
//    stale).
// ROCm implements both stream memory operations on ordinary memory as
// one-thread kernels in the caller's stream (the rank's own stream, not the
// daemon's).
//
// Threads: the rank's submitting thread (CommImpl's caller).
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "client/backend.h"
#include "client/device_memory.h"
#include "common/hip/hip_api.h"
#include "common/memory_kinds.h"
#include "common/status.h"

namespace dmagather::client {
namespace {

using ::dmagather::common::hip::HipApi;
using ::dmagather::common::hip::HipStatus;

int CurrentDevice() {
  if (!::dmagather::common::hip::HipAvailable().ok()) return -1;
  auto api = ::dmagather::common::hip::Hip();
  int d = -1;
  if ((*api)->hipGetDevice(&d) != hipSuccess) {
    (void)(*api)->hipGetLastError();
    return -1;
  }
  return d;
}

// The HIP calls DeviceMemory (device_memory.h) is written over.
class HipMemory final : public DeviceMemoryApi {
 public:
  explicit HipMemory(const HipApi* api) : api_(api) {}
  const char* backend() const override { return "hip"; }
  const char* label() const override { return "HIP"; }
  const char* malloc_name() const override { return "hipMalloc"; }
  const char* ipc_memory_kind() const override { return common::kMemoryHipIpc; }

  bool IsDeviceMemory(const void* ptr) const override {
    unsigned int type = 0;
    hipError_t err = api_->hipPointerGetAttribute(&type, HIP_POINTER_ATTRIBUTE_MEMORY_TYPE, const_cast<void*>(ptr));
    if (err != hipSuccess) (void)api_->hipGetLastError();
    // hipMemoryTypeDevice of the runtime's major (1 before 6.0, 2 after).
    return err == hipSuccess && type == api_->abi.memory_type_device;
  }
  absl::StatusOr<int> DeviceOrdinal(const void* ptr) const override {
    int ordinal = -1;
    hipError_t err =
        api_->hipPointerGetAttribute(&ordinal, HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL, const_cast<void*>(ptr));
    if (err != hipSuccess) return HipStatus("hipPointerGetAttribute(DEVICE_ORDINAL)", err);
    return ordinal;
  }
  // 0 where the runtime has no buffer id for it (not tracked).
  absl::StatusOr<uint64_t> BufferIdOf(const void* ptr) const override { return BufferId(ptr); }
  uint64_t BufferId(const void* ptr) const {
    unsigned long long id = 0;
    if (api_->hipPointerGetAttribute(&id, HIP_POINTER_ATTRIBUTE_BUFFER_ID, const_cast<void*>(ptr)) != hipSuccess) {
      (void)api_->hipGetLastError();
      return 0;
    }
    return id;
  }
  absl::Status AddressRange(const void* ptr, uintptr_t* base, uint64_t* bytes) const override {
    hipDeviceptr_t b = nullptr;
    size_t size = 0;
    hipError_t err = api_->hipMemGetAddressRange(&b, &size, const_cast<void*>(ptr));
    if (err != hipSuccess) return HipStatus("hipMemGetAddressRange", err);
    *base = reinterpret_cast<uintptr_t>(b);
    *bytes = size;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> IpcHandle(uintptr_t base) const override {
    hipIpcMemHandle_t h;
    hipError_t err = api_->hipIpcGetMemHandle(&h, reinterpret_cast<void*>(base));
    if (err != hipSuccess) {
      (void)api_->hipGetLastError();
      return HipStatus("hipIpcGetMemHandle", err);
    }
    return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
  }

  absl::Status SetDevice(int device) const override {
    DMAG_HIP_RETURN_IF_ERROR(api_, hipSetDevice(device));
    return absl::OkStatus();
  }
  absl::StatusOr<void*> Malloc(uint64_t bytes) const override {
    void* p = nullptr;
    DMAG_HIP_RETURN_IF_ERROR(api_, hipMalloc(&p, bytes));
    return p;
  }
  void Free(void* p) const override {
    if (api_->hipFree(p) != hipSuccess) (void)api_->hipGetLastError();
  }

 private:
  const HipApi* const api_;
};

class HipBackend : public ClientBackend {
 public:
  static absl::StatusOr<std::unique_ptr<ClientBackend>> Create(const ClientBackendContext& ctx) {
    if (ctx.device < 0) {
      return common::FallbackError("dmagatherd runs the hip backend but this process has no usable AMD GPU");
    }
    DMAG_ASSIGN_OR_RETURN(const HipApi* api, ::dmagather::common::hip::Hip());
    DMAG_HIP_RETURN_IF_ERROR(api, hipSetDevice(ctx.device));
    abi::CompletionV1* block = ctx.completion;
    DMAG_HIP_RETURN_IF_ERROR(api,
                             hipHostRegister(block, ctx.flag_bytes, hipHostRegisterMapped | hipHostRegisterPortable));
    void* ready = nullptr;
    void* done = nullptr;
    hipError_t err = api->hipHostGetDevicePointer(&ready, &block->ready_seq, 0);
    if (err == hipSuccess) err = api->hipHostGetDevicePointer(&done, &block->done_seq, 0);
    hipEvent_t release = nullptr, acquire = nullptr;
    if (err == hipSuccess) err = api->hipEventCreateWithFlags(&release, hipEventDisableTiming);
    if (err == hipSuccess) err = api->hipEventCreateWithFlags(&acquire, hipEventDisableTiming);
    if (err != hipSuccess) {
      if (release != nullptr) (void)api->hipEventDestroy(release);
      (void)api->hipHostUnregister(block);
      return HipStatus("hipHostGetDevicePointer/hipEventCreateWithFlags(completion flags)", err);
    }
    return std::unique_ptr<ClientBackend>(new HipBackend(api, ctx.device, block, ready, done, release, acquire));
  }
  ~HipBackend() override {
    (void)api_->hipEventDestroy(release_);
    (void)api_->hipEventDestroy(acquire_);
    if (api_->hipHostUnregister(block_) != hipSuccess) (void)api_->hipGetLastError();
  }

  const char* name() const override { return "hip"; }

  absl::StatusOr<std::unique_ptr<OwnedBuffer>> Allocate(uint64_t bytes) override {
    return AllocateDeviceBuffer(memory_, device_, bytes, [this](const void* p, uint64_t n) { return Describe(p, n); });
  }

  absl::Status PrepareThread() const override { return memory_->SetDevice(device_); }

  absl::StatusOr<MemoryExport> Describe(const void* ptr, uint64_t bytes) const override {
    DMAG_RETURN_IF_ERROR(CheckDeviceBuffer(*memory_, ptr, device_));
    return ExportIpcBuffer(*memory_, ptr, bytes);
  }

  uint64_t BufferId(const void* ptr) const override { return memory_->BufferId(ptr); }
  bool registers_on_submit() const override { return true; }

  // The caller's stream must be a live HIP stream of this process: ROCm 7
  // dereferences any other handle in hipMemcpyAsync/hipEventRecord (a
  // crash in the trainer), where 5.x/6.x returned an error. Checked on
  // every submit, and again by each call below that hands the stream to HIP
  // (a lookup in the runtime's stream set; no GPU work), so no path - a
  // wait on another stream included - reaches HIP with a bad handle.
  // Null (the default stream), hipStreamPerThread and hipStreamLegacy are
  // valid.
  absl::Status CheckStream(void* stream) const override {
    if (stream == nullptr) return absl::OkStatus();
    hipStream_t s = static_cast<hipStream_t>(stream);
    hipError_t err;
    const char* call;
    if (api_->abi.stream_check == ::dmagather::common::hip::StreamCheck::kGetId) {
      unsigned long long id = 0;
      err = api_->hipStreamGetId(s, &id);
      call = "hipStreamGetId";
    } else if (api_->abi.stream_check == ::dmagather::common::hip::StreamCheck::kGetDevice) {
      hipDevice_t device = 0;
      err = api_->hipStreamGetDevice(s, &device);
      call = "hipStreamGetDevice";
    } else {
      unsigned int flags = 0;
      err = api_->hipStreamGetFlags(s, &flags);
      call = "hipStreamGetFlags";
    }
    if (err == hipSuccess) return absl::OkStatus();
    (void)api_->hipGetLastError();
    return absl::InvalidArgumentError(absl::StrFormat("stream %p is not a live HIP stream of this process (%s)", stream,
                                                      HipStatus(call, err).message()));
  }
  bool copies_own_shard() const override { return true; }
  absl::Status CopyOwnShards(const OwnShardCopy* copies, size_t n, void* stream, bool) override {
    DMAG_RETURN_IF_ERROR(CheckStream(stream));
    // The runtime's device-to-device kind: hipMemcpyDeviceToDeviceNoCU from
    // ROCm 6.1, which moves a same-device copy of memory this process owns
    // (the own shard) from a blit kernel to an SDMA engine; captured too.
    // A send in host memory keeps hipMemcpyDefault.
    for (size_t i = 0; i < n; ++i) {
      const auto kind =
          memory_->IsDeviceMemory(copies[i].src) ? static_cast<hipMemcpyKind>(api_->abi.d2d_kind) : hipMemcpyDefault;
      DMAG_HIP_RETURN_IF_ERROR(
          api_, hipMemcpyAsync(copies[i].dst, copies[i].src, copies[i].bytes, kind, static_cast<hipStream_t>(stream)));
    }
    return absl::OkStatus();
  }
  absl::Status WriteReady(void* stream, uint32_t seq) override {
    DMAG_RETURN_IF_ERROR(CheckStream(stream));
    hipStream_t s = static_cast<hipStream_t>(stream);
    DMAG_HIP_RETURN_IF_ERROR(api_, hipEventRecord(release_, s));  // System-scope release of the inputs.
    DMAG_HIP_RETURN_IF_ERROR(api_, hipStreamWriteValue32(s, ready_dev_, seq, 0));
    return absl::OkStatus();
  }
  bool has_stream_waits() const override { return true; }
  // The reduce-scatter's sum needs a kernel built for AMD GPUs, which this
  // build has not (docs/REDUCE.md): every rank falls back, with this reason.
  absl::Status CanReduce() const override {
    return common::FallbackError("the hip backend has no reduction kernel in this build: reduce-scatter falls back");
  }
  absl::Status Reduce(const ReduceArgs&, void*) override { return CanReduce(); }
  absl::Status WaitDoneOnStream(void* stream, uint32_t seq) override {
    DMAG_RETURN_IF_ERROR(CheckStream(stream));
    hipStream_t s = static_cast<hipStream_t>(stream);
    DMAG_HIP_RETURN_IF_ERROR(api_, hipStreamWaitValue32(s, done_dev_, seq, hipStreamWaitValueGte, 0xFFFFFFFFu));
    DMAG_HIP_RETURN_IF_ERROR(api_, hipEventRecord(acquire_, s));  // System-scope acquire: L2 invalidated.
    return absl::OkStatus();
  }

 private:
  HipBackend(const HipApi* api, int device, abi::CompletionV1* block, void* ready_dev, void* done_dev,
             hipEvent_t release, hipEvent_t acquire)
      : api_(api),
        memory_(std::make_shared<HipMemory>(api)),
        device_(device),
        block_(block),
        ready_dev_(ready_dev),
        done_dev_(done_dev),
        release_(release),
        acquire_(acquire) {}

  const HipApi* const api_;
  const std::shared_ptr<const HipMemory> memory_;
  const int device_;
  abi::CompletionV1* const block_;
  void* const ready_dev_;
  void* const done_dev_;
  hipEvent_t const release_;
  hipEvent_t const acquire_;
};

// Probed before cuda (a process sees one vendor's GPUs).
// The device's uuid and bus id, which the daemon maps to its own numbering.
void IdentifyDevice(int device, std::string* uuid, std::string* pci_bus_id) {
  auto api = ::dmagather::common::hip::Hip();
  if (!api.ok()) return;
  hipUUID u;
  if ((*api)->hipDeviceGetUuid(&u, device) == hipSuccess) {
    uuid->assign(u.bytes, sizeof(u.bytes));
  } else {
    (void)(*api)->hipGetLastError();
  }
  char bus[32] = {0};
  if ((*api)->hipDeviceGetPCIBusId(bus, sizeof(bus), device) == hipSuccess) {
    *pci_bus_id = bus;
  } else {
    (void)(*api)->hipGetLastError();
  }
}

const bool kRegistered =
    RegisterClientBackend(ClientBackendEntry{"hip", 150, CurrentDevice, "hip", HipBackend::Create, IdentifyDevice});

}  // namespace
}  // namespace dmagather::client

// The hip client backend: the HIP side of a rank when dmagatherd runs the
// hip backend (AMD GPUs). The counterpart of cuda_backend.cc: describes
// device pointers (allocation base through hipMemGetAddressRange, size,
// buffer id, device) for the registration cache, exports HIP IPC handles of
// the base, and enqueues the stream side of a submit - the out-of-place
// self-shard copy, the ready write, the done wait - with no host
// synchronisation. libamdhip64 is reached through dlopen (common/hip), so
// the library loads on nodes without ROCm. NOT YET RUN ON AMD HARDWARE.
//
// Ordering and visibility (README, "AMD"): the daemon's SDMA copies write
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

#include "absl/strings/str_format.h"
#include "client/backend.h"
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

class HipBuffer : public OwnedBuffer {
 public:
  HipBuffer(const HipApi* api, void* p, MemoryExport exp) : api_(api), p_(p), exp_(std::move(exp)) {}
  ~HipBuffer() override {
    if (api_->hipFree(p_) != hipSuccess) (void)api_->hipGetLastError();
  }
  void* data() const override { return p_; }
  const MemoryExport& export_info() const override { return exp_; }

 private:
  const HipApi* const api_;
  void* const p_;
  const MemoryExport exp_;
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
    DMAG_HIP_RETURN_IF_ERROR(api, hipHostRegister(block, ctx.flag_bytes, hipHostRegisterMapped | hipHostRegisterPortable));
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
    DMAG_HIP_RETURN_IF_ERROR(api_, hipSetDevice(device_));
    void* p = nullptr;
    DMAG_HIP_RETURN_IF_ERROR(api_, hipMalloc(&p, bytes));
    auto exp = Describe(p, bytes);
    if (!exp.ok()) {
      (void)api_->hipFree(p);
      return exp.status();
    }
    return std::unique_ptr<OwnedBuffer>(new HipBuffer(api_, p, *std::move(exp)));
  }

  absl::StatusOr<MemoryExport> Describe(const void* ptr, uint64_t bytes) const override {
    hipDeviceptr_t p = const_cast<void*>(ptr);
    unsigned int type = 0;
    hipError_t err = api_->hipPointerGetAttribute(&type, HIP_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
    // hipMemoryTypeDevice of the runtime's major (1 before 6.0, 2 after).
    if (err != hipSuccess || type != api_->abi.memory_type_device) {
      if (err != hipSuccess) (void)api_->hipGetLastError();
      return common::FallbackError(absl::StrFormat(
          "%p is not HIP device memory (the hip backend moves device buffers; host or managed memory is not "
          "supported)",
          ptr));
    }
    int ordinal = -1;
    err = api_->hipPointerGetAttribute(&ordinal, HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
    if (err != hipSuccess) return HipStatus("hipPointerGetAttribute(DEVICE_ORDINAL)", err);
    if (ordinal != device_) {
      return absl::InvalidArgumentError(
          absl::StrFormat("buffer %p is on HIP device %d, but the rank uses device %d", ptr, ordinal, device_));
    }
    MemoryExport e;
    e.buffer_id = BufferId(ptr);
    hipDeviceptr_t base = nullptr;
    size_t size = 0;
    err = api_->hipMemGetAddressRange(&base, &size, p);
    if (err != hipSuccess) return HipStatus("hipMemGetAddressRange", err);
    e.base = reinterpret_cast<uintptr_t>(base);
    e.bytes = size;
    const uintptr_t at = reinterpret_cast<uintptr_t>(ptr);
    if (at - e.base > e.bytes || bytes > e.bytes - (at - e.base)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "buffer %p + %u bytes runs past the end of its HIP allocation (%u bytes at 0x%x)", ptr, bytes, e.bytes,
          e.base));
    }
    hipIpcMemHandle_t h;
    err = api_->hipIpcGetMemHandle(&h, base);
    if (err != hipSuccess) {
      (void)api_->hipGetLastError();
      absl::Status st = HipStatus("hipIpcGetMemHandle", err);
      return common::FallbackError(absl::StrCat(
          st.message(), ": this allocation cannot be shared with dmagatherd through HIP IPC (memory from "
          "hipMalloc can; stream-ordered pools and VMM allocations such as expandable segments cannot)"));
    }
    e.memory_kind = common::kMemoryHipIpc;
    e.handle.assign(reinterpret_cast<const char*>(&h), sizeof(h));
    return e;
  }

  uint64_t BufferId(const void* ptr) const override {
    unsigned long long id = 0;
    if (api_->hipPointerGetAttribute(&id, HIP_POINTER_ATTRIBUTE_BUFFER_ID, const_cast<void*>(ptr)) != hipSuccess) {
      (void)api_->hipGetLastError();
      return 0;
    }
    return id;
  }
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
    return absl::InvalidArgumentError(absl::StrFormat("stream %p is not a live HIP stream of this process (%s)",
                                                      stream, HipStatus(call, err).message()));
  }
  bool copies_own_shard() const override { return true; }
  absl::Status CopyAsync(void* dst, const void* src, uint64_t bytes, void* stream) override {
    DMAG_RETURN_IF_ERROR(CheckStream(stream));
    DMAG_HIP_RETURN_IF_ERROR(api_, hipMemcpyAsync(dst, src, bytes, hipMemcpyDefault, static_cast<hipStream_t>(stream)));
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
        device_(device),
        block_(block),
        ready_dev_(ready_dev),
        done_dev_(done_dev),
        release_(release),
        acquire_(acquire) {}

  const HipApi* const api_;
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

const bool kRegistered = RegisterClientBackend(ClientBackendEntry{
    "hip", 150, CurrentDevice, "hip", HipBackend::Create, IdentifyDevice});

}  // namespace
}  // namespace dmagather::client

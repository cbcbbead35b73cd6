// DeviceMemory: see device_memory.h.
#include "client/device_memory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace dmagather::client {
namespace {

class DeviceBuffer : public OwnedBuffer {
 public:
  DeviceBuffer(std::shared_ptr<const DeviceMemoryApi> m, void* p, MemoryExport exp)
      : m_(std::move(m)), p_(p), exp_(std::move(exp)) {}
  ~DeviceBuffer() override { m_->Free(p_); }
  void* data() const override { return p_; }
  const MemoryExport& export_info() const override { return exp_; }

 private:
  const std::shared_ptr<const DeviceMemoryApi> m_;
  void* const p_;
  const MemoryExport exp_;
};

}  // namespace

absl::Status CheckDeviceBuffer(const DeviceMemoryApi& m, const void* ptr, int device) {
  if (!m.IsDeviceMemory(ptr)) {
    return common::FallbackError(absl::StrFormat(
        "%p is not %s device memory (the %s backend moves device buffers; host or managed memory is not "
        "supported)",
        ptr, m.label(), m.backend()));
  }
  absl::StatusOr<int> ordinal = m.DeviceOrdinal(ptr);
  if (!ordinal.ok()) return ordinal.status();
  if (*ordinal != device) {
    return absl::InvalidArgumentError(
        absl::StrFormat("buffer %p is on %s device %d, but the rank uses device %d", ptr, m.label(), *ordinal, device));
  }
  return absl::OkStatus();
}

absl::StatusOr<MemoryExport> ExportIpcBuffer(const DeviceMemoryApi& m, const void* ptr, uint64_t bytes) {
  MemoryExport e;
  DMAG_ASSIGN_OR_RETURN(e.buffer_id, m.BufferIdOf(ptr));
  DMAG_RETURN_IF_ERROR(m.AddressRange(ptr, &e.base, &e.bytes));
  const uintptr_t at = reinterpret_cast<uintptr_t>(ptr);
  if (at - e.base > e.bytes || bytes > e.bytes - (at - e.base)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("buffer %p + %u bytes runs past the end of its %s allocation (%u bytes at 0x%x)", ptr, bytes,
                        m.label(), e.bytes, e.base));
  }
  absl::StatusOr<std::string> handle = m.IpcHandle(e.base);
  if (!handle.ok()) {
    return common::FallbackError(
        absl::StrCat(handle.status().message(), ": this allocation cannot be shared with dmagatherd through ",
                     m.label(), " IPC (memory from ", m.malloc_name(),
                     " can; stream-ordered pools and VMM allocations such as expandable segments cannot)"));
  }
  e.memory_kind = m.ipc_memory_kind();
  e.handle = *std::move(handle);
  return e;
}

absl::StatusOr<std::unique_ptr<OwnedBuffer>> AllocateDeviceBuffer(
    std::shared_ptr<const DeviceMemoryApi> m, int device, uint64_t bytes,
    const std::function<absl::StatusOr<MemoryExport>(const void*, uint64_t)>& describe) {
  DMAG_RETURN_IF_ERROR(m->SetDevice(device));
  DMAG_ASSIGN_OR_RETURN(void* p, m->Malloc(bytes));
  auto exp = describe(p, bytes);
  if (!exp.ok()) {
    m->Free(p);
    return exp.status();
  }
  return std::unique_ptr<OwnedBuffer>(new DeviceBuffer(std::move(m), p, *std::move(exp)));
}

}  // namespace dmagather::client

// GpuRuntime: see runtime.h.
#include "server/engines/gpu/runtime.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dmagather::server::engines::gpu {

std::string FormatDeviceUuid(const std::string& uuid) {
  if (uuid.size() != 16) return uuid.empty() ? "no uuid" : absl::StrCat("uuid of ", uuid.size(), " bytes");
  std::string hex;
  for (size_t i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) hex += '-';
    absl::StrAppend(&hex, absl::Hex(static_cast<unsigned char>(uuid[i]), absl::kZeroPad2));
  }
  return absl::StrCat("GPU-", hex);
}

absl::StatusOr<std::shared_ptr<ImportedRegion>> GpuRuntime::ImportOther(const RegionSpec& spec, int device,
                                                                        int rank_ordinal) {
  (void)device, (void)rank_ordinal;
  return common::FallbackError(absl::StrCat("this dmagatherd runs the ", name(), " backend, which imports ", label(),
                                            " IPC handles of device memory ('", ipc_memory_kind(),
                                            "'); the client offered '", spec.kind, "' memory"));
}

absl::StatusOr<void*> GpuRuntime::AllocPinned(uint64_t) {
  return absl::UnimplementedError(absl::StrCat("the ", name(), " runtime has no pinned staging memory"));
}
void GpuRuntime::FreePinned(void*) {}
absl::Status GpuRuntime::CopySync(int, void*, const void*, uint64_t) {
  return absl::UnimplementedError(absl::StrCat("the ", name(), " runtime has no staging copies"));
}

}  // namespace dmagather::server::engines::gpu

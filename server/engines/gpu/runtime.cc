// GpuRuntime: see runtime.h.
#include "server/engines/gpu/runtime.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dmagather::server::engines::gpu {

absl::StatusOr<std::shared_ptr<ImportedRegion>> GpuRuntime::ImportOther(const RegionSpec& spec, int device) {
  (void)device;
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

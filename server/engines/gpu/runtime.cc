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

}  // namespace dmagather::server::engines::gpu

// GpuEngineBackend: see gpu_backend.h.
#include "server/engines/gpu/gpu_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/engines/factory.h"
#include "server/engines/gpu/gpu_engine.h"

namespace dmagather::server::engines::gpu {

EngineBackend GpuEngineBackend(GpuBackendSpec spec) {
  EngineBackend b;
  b.name = spec.name;
  b.priority = spec.priority;
  b.label = spec.label;
  b.unusable = spec.unusable;
  b.default_stay_awake_ns = kGpuStayAwakeNs;
  b.create = [create_runtime =
                  spec.create_runtime](const EngineOptions& o) -> absl::StatusOr<std::unique_ptr<CopyEngine>> {
    GpuEngine::Options go;
    go.streams_per_device = o.streams_per_device;
    go.parallel_issue = o.parallel_issue;
    go.stay_awake_ns = static_cast<uint64_t>(std::max<int64_t>(0, o.stay_awake_ns));
    go.chunk_bytes = o.chunk_bytes;
    DMAG_ASSIGN_OR_RETURN(std::unique_ptr<GpuRuntime> rt, create_runtime(o));
    DMAG_ASSIGN_OR_RETURN(std::unique_ptr<GpuEngine> engine, GpuEngine::Create(std::move(rt), go));
    return std::unique_ptr<CopyEngine>(std::move(engine));
  };
  b.describe = [devices = spec.devices](const CopyEngine& e) {
    return absl::StrCat(static_cast<const GpuEngine&>(e).num_devices(), " ", devices);
  };
  return b;
}

}  // namespace dmagather::server::engines::gpu

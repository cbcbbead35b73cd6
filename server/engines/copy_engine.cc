#include "server/engines/copy_engine.h"

#include "absl/strings/str_cat.h"

namespace dmagather::server::engines {
namespace {
absl::Status NoStaging(const CopyEngine& e) {
  return absl::UnimplementedError(
      absl::StrCat("the ", e.name(), " backend cannot stage multi-node (ring) data through host memory"));
}
}  // namespace

absl::StatusOr<void*> CopyEngine::AllocStaging(uint64_t) { return NoStaging(*this); }
void CopyEngine::FreeStaging(void*) {}
absl::Status CopyEngine::StageOut(void*, const char*, uint64_t, const EngineRank*) { return NoStaging(*this); }
absl::Status CopyEngine::StageIn(char*, const void*, uint64_t, const EngineRank*) { return NoStaging(*this); }

}  // namespace dmagather::server::engines

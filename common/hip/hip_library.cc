// The process's own choice of libamdhip64: see hip_library.h.
#include "common/hip/hip_library.h"

#include "absl/base/const_init.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dmagather::common::hip {
namespace {

ABSL_CONST_INIT absl::Mutex mu(absl::kConstInit);

std::optional<std::string>& Chosen() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  static auto* chosen = new std::optional<std::string>();
  return *chosen;
}

}  // namespace

void SetHipLibrary(const std::string& file) {
  absl::MutexLock lock(&mu);
  Chosen() = file;
}

std::optional<std::string> HipLibrarySet() {
  absl::MutexLock lock(&mu);
  return Chosen();
}

}  // namespace dmagather::common::hip

// EngineRegistry: see engine_registry.h.
#include "server/engines/engine_registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace dmagather::server::engines {
namespace {

struct Registry {
  absl::Mutex mu;
  std::vector<EngineBackend> backends ABSL_GUARDED_BY(mu);  // Sorted: highest priority first.
};

// Constructed on first use, so registrations from any translation unit's
// static initializers find it (no initialization-order dependency).
Registry& GetRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

}  // namespace

void RegisterEngine(EngineBackend backend) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  for (const EngineBackend& b : r.backends) {
    if (b.name == backend.name) {
      std::fprintf(stderr, "dmagather: copy backend '%s' registered twice\n", backend.name.c_str());
      std::abort();
    }
  }
  auto at = std::find_if(r.backends.begin(), r.backends.end(),
                         [&](const EngineBackend& b) { return b.priority < backend.priority; });
  r.backends.insert(at, std::move(backend));
}

void RegisterEngine(std::string name, int priority, EngineCreateFn create) {
  EngineBackend b;
  b.name = std::move(name);
  b.priority = priority;
  b.create = std::move(create);
  RegisterEngine(std::move(b));
}

std::vector<EngineBackend> RegisteredEngines() {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  return r.backends;
}

std::string RegisteredEngineNames() {
  std::vector<std::string> names;
  for (const EngineBackend& b : RegisteredEngines()) names.push_back(b.name);
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

}  // namespace dmagather::server::engines

#include "client/backend.h"

#include <algorithm>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"

namespace dmagather::client {
namespace {

// The backends compiled in (registered from static initializers), highest
// priority first.
struct Registry {
  absl::Mutex mu;
  std::vector<ClientBackendEntry> entries ABSL_GUARDED_BY(mu);
};

// Constructed on first use, so registrations from any translation unit's
// static initializers find it.
Registry& GetRegistry() {
  static auto* registry = new Registry();
  return *registry;
}

}  // namespace

absl::Status ClientBackend::CanReduce() const {
  return common::FallbackError(absl::StrCat("the ", name(), " backend cannot run the reduce-scatter's sum"));
}

bool RegisterClientBackend(ClientBackendEntry entry) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  auto& e = r.entries;
  e.push_back(std::move(entry));
  std::stable_sort(e.begin(), e.end(), [](const auto& a, const auto& b) { return a.priority > b.priority; });
  return true;
}

ProbedDevice ProbeDevice() {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  for (const ClientBackendEntry& e : r.entries) {
    if (!e.probe_device) continue;
    const int d = e.probe_device();
    if (d < 0) continue;
    ProbedDevice p{e.device_kind, d};
    if (e.identify) e.identify(d, &p.uuid, &p.pci_bus_id);
    return p;
  }
  return ProbedDevice{};
}

absl::StatusOr<std::unique_ptr<ClientBackend>> CreateClientBackend(const std::string& name,
                                                                   const ClientBackendContext& ctx) {
  std::vector<std::string> have;
  const ClientBackendEntry* found = nullptr;
  {
    Registry& r = GetRegistry();
    absl::MutexLock lock(&r.mu);
    for (const ClientBackendEntry& e : r.entries) {
      have.push_back(e.name);
      if (e.name == name) found = &e;
    }
  }
  if (found == nullptr) {
    return common::FallbackError(absl::StrCat("dmagatherd runs the '", name, "' backend, which this libdmagather ",
                                              "was built without (it has: ", absl::StrJoin(have, ", "), ")"));
  }
  auto b = found->create(ctx);
  if (!b.ok() && !common::IsFallback(b.status()) && b.status().code() != absl::StatusCode::kInvalidArgument) {
    // The backend cannot run in this process (no device, no driver): the
    // framework's own collective is the way.
    return common::FallbackError(absl::StrCat(name, " backend: ", b.status().message()));
  }
  return b;
}

}  // namespace dmagather::client

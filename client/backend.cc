#include "client/backend.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace dmagather::client {
namespace {

std::vector<ClientBackendEntry>& Entries() {
  static auto* entries = new std::vector<ClientBackendEntry>();
  return *entries;
}

std::mutex& EntriesMu() {
  static auto* mu = new std::mutex();
  return *mu;
}

}  // namespace

bool RegisterClientBackend(ClientBackendEntry entry) {
  std::lock_guard<std::mutex> lock(EntriesMu());
  auto& e = Entries();
  e.push_back(std::move(entry));
  std::stable_sort(e.begin(), e.end(), [](const auto& a, const auto& b) { return a.priority > b.priority; });
  return true;
}

ProbedDevice ProbeDevice() {
  std::lock_guard<std::mutex> lock(EntriesMu());
  for (const ClientBackendEntry& e : Entries()) {
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
    std::lock_guard<std::mutex> lock(EntriesMu());
    for (const ClientBackendEntry& e : Entries()) {
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

// RankImports: see rank_imports.h.
#include "server/engines/gpu/rank_imports.h"

#include <glog/logging.h>

#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "server/engines/gpu/gpu_rank.h"

namespace dmagather::server::engines::gpu {
namespace {

// A rank's allocation opened through the runtime's IPC; closed with the
// last reference (which may outlive the engine: it shares the runtime),
// under every device's order lock (the close unmaps it from every peer).
class IpcRegion : public ImportedRegion {
 public:
  IpcRegion(std::shared_ptr<GpuRuntime> rt, std::shared_ptr<DeviceOrder> order, char* base, uint64_t bytes, int device)
      : rt_(std::move(rt)), order_(std::move(order)), base_(base), bytes_(bytes), device_(device) {}
  ~IpcRegion() override {
    DeviceOrder::Hold hold(*order_, order_->all());
    rt_->CloseIpc(device_, base_);
  }
  char* base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  const std::shared_ptr<GpuRuntime> rt_;
  const std::shared_ptr<DeviceOrder> order_;
  char* const base_;
  const uint64_t bytes_;
  const int device_;
};

// A region the runtime imported its own way (VMM): released under every
// device's order lock, as an IPC close is.
class OrderedRegion : public ImportedRegion {
 public:
  OrderedRegion(std::shared_ptr<ImportedRegion> inner, std::shared_ptr<DeviceOrder> order)
      : inner_(std::move(inner)), order_(std::move(order)) {}
  ~OrderedRegion() override {
    DeviceOrder::Hold hold(*order_, order_->all());
    inner_.reset();
  }
  char* base() const override { return inner_->base(); }
  uint64_t bytes() const override { return inner_->bytes(); }

 private:
  std::shared_ptr<ImportedRegion> inner_;
  const std::shared_ptr<DeviceOrder> order_;
};

}  // namespace

RankImports::RankImports(std::shared_ptr<GpuRuntime> runtime, std::shared_ptr<DeviceOrder> order)
    : runtime_(std::move(runtime)), order_(std::move(order)), num_devices_(runtime_->num_devices()) {
  identities_.assign(num_devices_, DeviceIdentity{});
}

void RankImports::Identify() {
  GpuRuntime& rt = *runtime_;
  identities_.assign(num_devices_, DeviceIdentity{});
  for (int d = 0; d < num_devices_; ++d) {
    absl::StatusOr<DeviceIdentity> id = rt.Identify(d);
    if (!id.ok()) {
      LOG(WARNING) << "device " << d << ": no identity (" << id.status().message()
                   << "); ranks that name their GPU cannot be mapped to it";
      continue;
    }
    identities_[d] = *std::move(id);
    LOG(INFO) << "device " << d << ": " << identities_[d].name << " " << FormatDeviceUuid(identities_[d].uuid) << " at "
              << (identities_[d].pci_bus_id.empty() ? "an unknown bus id" : identities_[d].pci_bus_id);
  }
}

absl::StatusOr<int> RankImports::DaemonDevice(const DeviceRef& ref) const {
  auto list = [&] {
    std::vector<std::string> v;
    for (int d = 0; d < num_devices_; ++d) {
      v.push_back(absl::StrCat(d, ": ", FormatDeviceUuid(identities_[d].uuid), " ", identities_[d].pci_bus_id));
    }
    return absl::StrJoin(v, ", ");
  };
  auto pick = [&](auto&& same, const std::string& what) -> absl::StatusOr<int> {
    int found = -1, matches = 0;
    for (int d = 0; d < num_devices_; ++d) {
      if (same(identities_[d])) {
        found = d;
        ++matches;
      }
    }
    if (matches == 1) return found;
    if (matches > 1) {
      return common::FallbackError(absl::StrCat("the rank's ", runtime_->label(), " device ", what, " matches ",
                                                matches, " devices of dmagatherd (", list(), ")"));
    }
    return common::FallbackError(absl::StrCat("the rank's ", runtime_->label(), " device ", ref.ordinal, " (", what,
                                              ") is not one of the ", num_devices_, " device(s) dmagatherd sees (",
                                              list(), "): give dmagatherd every GPU of the node"));
  };
  bool known = false;
  for (const DeviceIdentity& id : identities_) known |= !id.uuid.empty() || !id.pci_bus_id.empty();
  if (!ref.uuid.empty()) {
    if (ref.uuid.size() != 16) {
      return absl::InvalidArgumentError(absl::StrCat("a device uuid has 16 bytes, the rank sent ", ref.uuid.size()));
    }
    if (known) return pick([&](const DeviceIdentity& id) { return id.uuid == ref.uuid; }, FormatDeviceUuid(ref.uuid));
  }
  if (!ref.pci_bus_id.empty() && known) {
    if (ref.pci_bus_id.size() > 64) return absl::InvalidArgumentError("the rank's PCI bus id is too long");
    return pick([&](const DeviceIdentity& id) { return absl::EqualsIgnoreCase(id.pci_bus_id, ref.pci_bus_id); },
                absl::StrCat("bus ", ref.pci_bus_id));
  }
  // No identity on one side (an older client, or a runtime that cannot
  // tell): the rank's ordinal, which is right only when the rank sees the
  // devices the daemon sees.
  std::call_once(ordinal_trusted_logged_, [&] {
    LOG(WARNING) << "a rank named its " << runtime_->label() << " device by ordinal only"
                 << (known ? "" : " (dmagatherd knows no device identities)")
                 << ": trusting it, which is right only if the rank and dmagatherd see the same devices";
  });
  if (ref.ordinal >= num_devices_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the rank's ", runtime_->label(), " device ", ref.ordinal, " is not visible to dmagatherd, which sees ",
        num_devices_, " device(s): run the daemon and the ranks with the same visible devices"));
  }
  return ref.ordinal;
}

// The import entry point: a rank's memory, by kind. The runtime's IPC
// handles are opened once and cached by handle; any other kind is the
// runtime's (ImportOther).
absl::StatusOr<std::shared_ptr<ImportedRegion>> RankImports::Import(const RegionSpec& spec) {
  if (spec.rank == nullptr) return absl::InvalidArgumentError("import without the owning rank");
  const int device = AsGpu(spec.rank)->device();
  if (spec.kind != runtime_->ipc_memory_kind()) {
    DeviceOrder::Hold hold(*order_, order_->all());  // Mapped for every device that reaches it.
    DMAG_ASSIGN_OR_RETURN(std::shared_ptr<ImportedRegion> inner,
                          runtime_->ImportOther(spec, device, AsGpu(spec.rank)->rank_ordinal()));
    return std::shared_ptr<ImportedRegion>(std::make_shared<OrderedRegion>(std::move(inner), order_));
  }
  return ImportIpc(spec, device);
}

absl::StatusOr<std::shared_ptr<ImportedRegion>> RankImports::ImportIpc(const RegionSpec& spec, int device) {
  if (spec.handle.size() != runtime_->ipc_handle_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(runtime_->label(), " IPC handle has ", spec.handle.size(),
                                                   " bytes, expected ", runtime_->ipc_handle_bytes()));
  }
  absl::MutexLock lock(&mu_);
  auto it = imports_.find(spec.handle);
  if (it != imports_.end()) {
    if (auto region = it->second.lock(); region != nullptr && region->bytes() >= spec.bytes) return region;
  }
  for (auto i = imports_.begin(); i != imports_.end();) i = i->second.expired() ? imports_.erase(i) : std::next(i);
  // Opened (and closed) under every device's order lock: the mapping is
  // made in (and unmade from) every peer's context.
  std::optional<DeviceOrder::Hold> hold(std::in_place, *order_, order_->all());
  DMAG_ASSIGN_OR_RETURN(IpcMapping m, runtime_->OpenIpc(device, spec.handle));
  if (m.bytes < spec.bytes) {
    runtime_->CloseIpc(device, m.base);
    return absl::InvalidArgumentError(absl::StrCat("the client registered ", spec.bytes, " bytes but its ",
                                                   runtime_->label(), " allocation has only ", m.bytes));
  }
  hold.reset();
  auto region = std::make_shared<IpcRegion>(runtime_, order_, m.base, spec.bytes, device);
  imports_[spec.handle] = region;
  return std::shared_ptr<ImportedRegion>(std::move(region));
}

absl::StatusOr<std::unique_ptr<EngineRank>> RankImports::AttachRank(const RankAttach& a) {
  if (a.device.kind != runtime_->device_kind() || a.device.ordinal < 0) {
    return common::FallbackError(absl::StrCat("this dmagatherd runs the ", runtime_->name(),
                                              " backend but the rank has no ", runtime_->label(),
                                              " device (no GPU visible to it, or its libdmagather "
                                              "has no ",
                                              runtime_->label(), " support)"));
  }
  DMAG_ASSIGN_OR_RETURN(const int device, DaemonDevice(a.device));
  if (device != a.device.ordinal || !a.device.uuid.empty()) {
    LOG(INFO) << "rank " << a.rank << ": its " << runtime_->label() << " device " << a.device.ordinal << " ("
              << FormatDeviceUuid(a.device.uuid) << ") is dmagatherd's device " << device;
  }
  absl::StatusOr<uint64_t> flag;
  {
    DeviceOrder::Hold hold(*order_, order_->all());  // Portable: registered for every device.
    flag = runtime_->RegisterFlags(device, a.flag_pages, a.flag_bytes, a.ready_word);
  }
  DMAG_RETURN_IF_ERROR(flag.status());
  // The done flag: the same registration, at its offset from the ready flag.
  const uint64_t done_flag = a.done_word == nullptr
                                 ? 0
                                 : *flag + static_cast<uint64_t>(reinterpret_cast<const char*>(a.done_word) -
                                                                 reinterpret_cast<const char*>(a.ready_word));
  return std::unique_ptr<EngineRank>(new GpuRank(runtime_, order_, device, a.device.ordinal, a.flag_pages, *flag,
                                                 a.ready_word, done_flag, a.done_word));
}

}  // namespace dmagather::server::engines::gpu

// The ibverbs Transport (ibverbs_transport.h): opens the device once
// (ibverbs_device.h) and upgrades bootstrap TCP connections to links
// (ibverbs_connection.h); its options from dmagatherd's --ib_* flags.
#include "server/transport/ibverbs_transport.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "server/transport/ibverbs_connection.h"
#include "server/transport/ibverbs_device.h"
#include "server/transport/tcp_transport.h"

namespace dmagather::server::transport {
namespace {

class IbverbsTransport : public Transport {
 public:
  IbverbsTransport(std::shared_ptr<VerbsDevice> dev, const IbverbsOptions& o)
      : dev_(std::move(dev)), options_(o), tcp_(MakeTcpTransport()) {}
  const char* name() const override { return "ibverbs"; }
  absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) override {
    return tcp_->Listen(address);
  }
  absl::StatusOr<std::unique_ptr<Connection>> Connect(const std::string& address, absl::Duration timeout) override {
    return tcp_->Connect(address, timeout);
  }
  absl::StatusOr<std::unique_ptr<Connection>> Upgrade(std::unique_ptr<Connection> bootstrap, bool initiator) override {
    if (bootstrap == nullptr) return absl::InvalidArgumentError("Upgrade: no bootstrap connection");
    auto c = std::make_unique<IbverbsConnection>(dev_, options_, std::move(bootstrap));
    DMAG_RETURN_IF_ERROR(c->Setup(initiator));
    return std::unique_ptr<Connection>(std::move(c));
  }

 private:
  const std::shared_ptr<VerbsDevice> dev_;
  const IbverbsOptions options_;
  const std::unique_ptr<Transport> tcp_;
};

// The options MakeIbverbsTransport() uses (SetIbverbsOptions).
ABSL_CONST_INIT absl::Mutex options_mu(absl::kConstInit);
IbverbsOptions& DaemonOptions() ABSL_EXCLUSIVE_LOCKS_REQUIRED(options_mu) {
  static IbverbsOptions* o = new IbverbsOptions();
  return *o;
}

}  // namespace

absl::StatusOr<IbverbsOptions> IbverbsOptionsFromFlags(const std::string& device, int gid_index, int slots,
                                                       int64_t slot_bytes) {
  IbverbsOptions o;
  if (!device.empty()) {
    std::string s = device;
    const size_t colon = s.find(':');
    if (colon != std::string::npos) {
      if (!absl::SimpleAtoi(s.substr(colon + 1), &o.port) || o.port < 1 || o.port > 255) {
        return absl::InvalidArgumentError(absl::StrCat("--ib_device='", s, "': bad port"));
      }
      s.resize(colon);
    }
    o.device = s;
  }
  o.gid_index = gid_index;
  o.slots = slots;
  if (slot_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--ib_slot_bytes=", slot_bytes, " is not positive"));
  }
  o.slot_bytes = static_cast<size_t>(slot_bytes);
  return o;
}

void SetIbverbsOptions(const IbverbsOptions& options) {
  absl::MutexLock lock(&options_mu);
  DaemonOptions() = options;
}

absl::StatusOr<std::unique_ptr<Transport>> MakeIbverbsTransport(VerbsApi* api, const IbverbsOptions& o) {
  if (o.slots < 1 || o.slots > kIbverbsMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("ibverbs: ", o.slots, " slots (--ib_slots) is not in [1, ", kIbverbsMaxSlots, "]"));
  }
  if (o.slot_bytes < 1 || o.slot_bytes > kIbverbsMaxSlotBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ibverbs: slot size ", o.slot_bytes,
                                                   " (--ib_slot_bytes) is not in [1, ", kIbverbsMaxSlotBytes, "]"));
  }
  DMAG_ASSIGN_OR_RETURN(std::shared_ptr<VerbsDevice> dev, OpenVerbsDevice(api, o));
  return std::unique_ptr<Transport>(new IbverbsTransport(std::move(dev), o));
}

absl::StatusOr<std::unique_ptr<Transport>> MakeIbverbsTransport() {
  IbverbsOptions o;
  {
    absl::MutexLock lock(&options_mu);
    o = DaemonOptions();
  }
  return MakeIbverbsTransport(RealVerbs(), o);
}

}  // namespace dmagather::server::transport

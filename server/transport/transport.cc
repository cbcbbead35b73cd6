#include "server/transport/transport.h"

#include "absl/strings/str_cat.h"
#include "server/transport/ibverbs_transport.h"
#include "server/transport/tcp_transport.h"

namespace dmagather::server::transport {

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const std::string& name, std::string* reason) {
  if (name == "tcp") {
    *reason = "--transport=tcp";
    return MakeTcpTransport();
  }
  if (name == "ibverbs") {
    auto t = MakeIbverbsTransport();
    if (t.ok()) *reason = "--transport=ibverbs";
    return t;
  }
  if (name == "auto") {
    auto t = MakeIbverbsTransport();
    if (t.ok()) {
      *reason = "auto: an RDMA device is usable";
      return t;
    }
    *reason = absl::StrCat("auto: ibverbs unavailable (", t.status().message(), "); using tcp");
    return MakeTcpTransport();
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown transport '", name, "' (expected tcp, ibverbs or auto)"));
}

}  // namespace dmagather::server::transport

#include "server/transport/ibverbs_transport.h"

#include <infiniband/verbs.h>

#include "absl/strings/str_cat.h"

namespace dmagather::server::transport {

absl::StatusOr<std::unique_ptr<Transport>> MakeIbverbsTransport() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) {
    if (list != nullptr) ibv_free_device_list(list);
    return absl::UnavailableError("no RDMA device (ibv_get_device_list found none)");
  }
  ibv_free_device_list(list);
  return absl::UnavailableError(absl::StrCat(n, " RDMA device(s) found, but the ibverbs data path is not built"));
}

}  // namespace dmagather::server::transport

// VerbsDevice: the RDMA device, port and GID the ibverbs transport
// (ibverbs_transport.cc) runs on, opened once per transport with one
// protection domain its links share. OpenVerbsDevice picks the device
// (--ib_device or the first with an active port) and the GID
// (RoCE v2 with an IPv4-mapped address where the port is Ethernet).
//
// Threads: opened on the daemon's main thread; read-only afterwards.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/transport/ibverbs_transport.h"
#include "server/transport/verbs_api.h"

namespace dmagather::server::transport {

// An opened device, port and GID, with one protection domain shared by the
// links of a transport.
struct VerbsDevice {
  VerbsApi* api = nullptr;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  std::string name;
  uint8_t port = 0;
  ibv_port_attr port_attr{};
  ibv_device_attr device_attr{};
  int gid_index = 0;
  ibv_gid gid{};

  ~VerbsDevice() {
    if (pd != nullptr) api->DeallocPd(pd);
    if (ctx != nullptr) api->CloseDevice(ctx);
  }
  bool ethernet() const { return port_attr.link_layer == IBV_LINK_LAYER_ETHERNET; }
  std::string where() const { return absl::StrCat(name, " port ", port); }
};

absl::StatusOr<std::shared_ptr<VerbsDevice>> OpenVerbsDevice(VerbsApi* api, const IbverbsOptions& o);

}  // namespace dmagather::server::transport

// VerbsDevice: see ibverbs_device.h.
#include "server/transport/ibverbs_device.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace dmagather::server::transport {
namespace {

const char* PortStateName(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_NOP:
      return "NOP";
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER:
      return "ACTIVE_DEFER";
  }
  return "unknown";
}

bool GidIsZero(const ibv_gid& g) {
  static const ibv_gid zero{};
  return std::memcmp(&g, &zero, sizeof(g)) == 0;
}

// ::ffff:a.b.c.d (what RoCE uses for an interface's IPv4 address).
bool GidIsIpv4Mapped(const ibv_gid& g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, sizeof(prefix)) == 0;
}

absl::Status PickGid(VerbsDevice* d, const IbverbsOptions& o) {
  const int table = d->port_attr.gid_tbl_len;
  if (o.gid_index >= 0) {
    if (table > 0 && o.gid_index >= table) {
      return absl::InvalidArgumentError(
          absl::StrCat("GID index ", o.gid_index, " (--ib_gid_index) is out of ", d->where(), "'s table of ", table));
    }
    d->gid_index = o.gid_index;
  } else if (!d->ethernet()) {
    d->gid_index = 0;  // InfiniBand: addressed by LID; GID 0 is the port GUID.
  } else {
    // RoCE: prefer RoCE v2 (routable UDP) with an IPv4-mapped address.
    int v2_ipv4 = -1, v2_any = -1;
    bool any_entry = false;
    for (int i = 0; i < std::min(table, 256); ++i) {
      ibv_gid_entry e{};
      if (d->api->QueryGidEntry(d->ctx, d->port, i, &e) != 0) continue;
      any_entry = true;
      if (e.gid_type != IBV_GID_TYPE_ROCE_V2 || GidIsZero(e.gid)) continue;
      if (v2_any < 0) v2_any = i;
      if (GidIsIpv4Mapped(e.gid)) {
        v2_ipv4 = i;
        break;
      }
    }
    // Without GID types (old kernels): index 3 is RoCE v2 / IPv4 on mlx5.
    d->gid_index = v2_ipv4 >= 0 ? v2_ipv4 : v2_any >= 0 ? v2_any : (!any_entry && table > 3) ? 3 : 0;
  }
  if (int rc = d->api->QueryGid(d->ctx, d->port, d->gid_index, &d->gid); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("ibv_query_gid(", d->where(), ", index ", d->gid_index, "): ", strerror(rc)));
  }
  if (d->ethernet() && GidIsZero(d->gid)) {
    return absl::UnavailableError(
        absl::StrCat("GID index ", d->gid_index, " of ", d->where(), " is empty (RoCE needs one; set --ib_gid_index)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<VerbsDevice>> OpenVerbsDevice(VerbsApi* api, const IbverbsOptions& o) {
  errno = 0;
  int n = 0;
  ibv_device** list = api->GetDeviceList(&n);
  if (list == nullptr || n <= 0) {
    const int err = errno;
    if (list != nullptr) api->FreeDeviceList(list);
    if (list == nullptr && err != 0) {
      // ENOSYS: the kernel has no RDMA support at all.
      return absl::UnavailableError(
          absl::StrCat("no RDMA device (ibv_get_device_list found none: ", strerror(err), ")"));
    }
    return absl::UnavailableError("no RDMA device (ibv_get_device_list found none)");
  }
  auto dev = std::make_shared<VerbsDevice>();
  dev->api = api;
  std::vector<std::string> names, why_not;
  bool found = false;
  for (int i = 0; i < n && !found; ++i) {
    const char* raw = api->GetDeviceName(list[i]);
    std::string name = raw != nullptr ? raw : "?";
    names.push_back(name);
    if (!o.device.empty() && name != o.device) continue;
    ibv_context* ctx = api->OpenDevice(list[i]);
    if (ctx == nullptr) {
      why_not.push_back(absl::StrCat(name, ": ibv_open_device: ", strerror(errno)));
      continue;
    }
    ibv_device_attr da{};
    if (int rc = api->QueryDevice(ctx, &da); rc != 0) {
      why_not.push_back(absl::StrCat(name, ": ibv_query_device: ", strerror(rc)));
      api->CloseDevice(ctx);
      continue;
    }
    const int first = o.port > 0 ? o.port : 1, last = o.port > 0 ? o.port : da.phys_port_cnt;
    for (int p = first; p <= last; ++p) {
      ibv_port_attr pa{};
      if (int rc = api->QueryPort(ctx, static_cast<uint8_t>(p), &pa); rc != 0) {
        why_not.push_back(absl::StrCat(name, " port ", p, ": ibv_query_port: ", strerror(rc)));
        continue;
      }
      if (pa.state != IBV_PORT_ACTIVE) {
        why_not.push_back(absl::StrCat(name, " port ", p, ": ", PortStateName(pa.state)));
        continue;
      }
      dev->ctx = ctx;
      dev->name = name;
      dev->port = static_cast<uint8_t>(p);
      dev->port_attr = pa;
      dev->device_attr = da;
      found = true;
      break;
    }
    if (!found) api->CloseDevice(ctx);
  }
  api->FreeDeviceList(list);  // Opened devices stay valid.
  if (!found) {
    if (!o.device.empty() && std::find(names.begin(), names.end(), o.device) == names.end()) {
      return absl::UnavailableError(
          absl::StrCat("RDMA device '", o.device, "' (--ib_device) not found; found ", absl::StrJoin(names, ", ")));
    }
    return absl::UnavailableError(absl::StrCat("RDMA device(s) ", absl::StrJoin(names, ", "),
                                               " found but none has an active port (", absl::StrJoin(why_not, "; "),
                                               ")"));
  }
  DMAG_RETURN_IF_ERROR(PickGid(dev.get(), o));
  dev->pd = api->AllocPd(dev->ctx);
  if (dev->pd == nullptr) {
    return absl::UnavailableError(absl::StrCat("ibv_alloc_pd on ", dev->name, ": ", strerror(errno)));
  }
  return dev;
}

}  // namespace dmagather::server::transport

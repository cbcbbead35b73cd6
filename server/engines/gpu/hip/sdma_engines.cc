#include "server/engines/gpu/hip/sdma_engines.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dmagather::server::engines::gpu::hip {
namespace {

int Popcount(uint32_t m) { return __builtin_popcount(m); }
int BitIndex(uint32_t bit) { return __builtin_ctz(bit); }

}  // namespace

absl::StatusOr<PciAddress> ParsePciBusId(const std::string& text) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &tail) != 4 || bus > 0xff || dev > 0x1f ||
      fn > 0x7) {
    return absl::InvalidArgumentError(absl::StrCat("not a PCI bus id (dddd:bb:dd.f): \"", text, "\""));
  }
  return PciAddress{domain, (bus << 8) | (dev << 3) | fn};
}

absl::StatusOr<std::vector<int>> MatchDevicesToAgents(const std::vector<PciAddress>& devices,
                                                      const std::vector<PciAddress>& agents) {
  std::vector<int> agent_of(devices.size(), -1);
  for (size_t d = 0; d < devices.size(); ++d) {
    int found = 0;
    for (size_t a = 0; a < agents.size(); ++a) {
      if (agents[a] == devices[d]) {
        agent_of[d] = static_cast<int>(a);
        ++found;
      }
    }
    if (found != 1) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "HIP device %d (PCI %04x:%02x:%02x.%x) matches %d of the %d HSA GPU agents (expected 1): the device "
          "lists differ (HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES?), so engines are not assigned by dmagatherd",
          d, devices[d].domain, devices[d].bdf >> 8, (devices[d].bdf >> 3) & 0x1f, devices[d].bdf & 7, found,
          agents.size()));
    }
  }
  return agent_of;
}

SdmaEnginePlan SdmaEnginePlan::RocrChoice(int num_devices, std::string reason) {
  SdmaEnginePlan p(num_devices);
  for (int dst = 0; dst < num_devices; ++dst) {
    for (int src = 0; src < num_devices; ++src) {
      if (dst != src) p.why_[dst * num_devices + src] = reason;
    }
  }
  return p;
}

SdmaEnginePlan SdmaEnginePlan::Build(int n, const EngineStatus& status, uint32_t skip_mask) {
  SdmaEnginePlan p(n);
  struct Link {
    int dst, src;
    uint32_t mask;
  };
  std::vector<Link> links;
  for (int dst = 0; dst < n; ++dst) {
    for (int src = 0; src < n; ++src) {
      if (dst == src) continue;
      auto mask = status(dst, src);
      std::string& why = p.why_[dst * n + src];
      if (!mask.ok()) {
        why = absl::StrCat("hsa_amd_memory_copy_engine_status failed: ", mask.status().message());
      } else if ((*mask & ~skip_mask) == 0) {
        why = absl::StrFormat("no usable SDMA engine (driver reports 0x%x, skipped 0x%x)", *mask, skip_mask);
      } else {
        links.push_back(Link{dst, src, *mask & ~skip_mask});
      }
    }
  }
  // Fewest choices first; ties in (dst, src) order, so the plan is deterministic.
  std::stable_sort(links.begin(), links.end(),
                   [](const Link& a, const Link& b) { return Popcount(a.mask) < Popcount(b.mask); });
  // A copy between GPUs runs on an engine of its source GPU (ROCr's copy
  // agent), and the mask is of that GPU's engines: used[src] = engines
  // already given to a link out of src; uses[src][bit index] = how many of
  // its links share that engine.
  std::vector<uint32_t> used(n, 0);
  std::vector<std::vector<int>> uses(n, std::vector<int>(32, 0));
  for (const Link& l : links) {
    const uint32_t free = l.mask & ~used[l.src];
    uint32_t bit = 0;
    if (free != 0) {
      bit = free & -free;  // Lowest free engine.
    } else {
      for (uint32_t m = l.mask; m != 0; m &= m - 1) {
        const uint32_t b = m & -m;
        if (bit == 0 || uses[l.src][BitIndex(b)] < uses[l.src][BitIndex(bit)]) bit = b;
      }
      ++p.shared_;
    }
    used[l.src] |= bit;
    ++uses[l.src][BitIndex(bit)];
    p.engine_[l.dst * n + l.src] = bit;
    ++p.assigned_;
  }
  return p;
}

uint32_t SdmaEnginePlan::EngineFor(int dst, int src) const {
  if (dst < 0 || src < 0 || dst >= n_ || src >= n_) return 0;
  return engine_[dst * n_ + src];
}

const std::string& SdmaEnginePlan::WhyRocr(int dst, int src) const {
  static const std::string kNone;
  if (dst < 0 || src < 0 || dst >= n_ || src >= n_) return kNone;
  return why_[dst * n_ + src];
}

std::string SdmaEnginePlan::Describe() const {
  std::string out = absl::StrCat(assigned_, " link(s) on engines chosen by dmagatherd (", shared_, " sharing)");
  for (int dst = 0; dst < n_; ++dst) {
    for (int src = 0; src < n_; ++src) {
      if (dst == src) continue;
      const uint32_t e = engine_[dst * n_ + src];
      if (e != 0) {
        absl::StrAppend(&out, "; ", dst, "<-", src, ": engine ", BitIndex(e));
      } else {
        absl::StrAppend(&out, "; ", dst, "<-", src, ": ROCr (", why_[dst * n_ + src], ")");
      }
    }
  }
  return out;
}

}  // namespace dmagather::server::engines::gpu::hip

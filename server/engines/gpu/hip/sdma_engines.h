// SdmaEnginePlan: which SDMA engine each peer link of an AMD node uses, when
// dmagatherd assigns engines itself (hsa_amd_memory_async_copy_on_engine,
// ROCm >= 5.7) instead of leaving every copy to ROCr's choice. Pure: the
// runtime passes in what HSA reports (hsa_amd_memory_copy_engine_status per
// link, each HIP device's PCI address and each HSA GPU agent's), so the
// logic is unit-tested without ROCm (tests/server/engines/gpu).
//
//  - Devices to agents by PCI address (domain:bus:device.function), never by
//    position: with HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES slicing the
//    i-th HIP device is not the i-th HSA agent (queues were seen wired to
//    the wrong peer that way). A device without exactly one matching agent
//    leaves the whole node to ROCr, with the reason.
//  - One fixed engine per link (dst <- src): a link's engine is one the
//    driver reports available for it (engines fused off - as on MI308X,
//    where copies on them hang - are never in that mask) and not in the
//    operator's skip mask. A copy between GPUs runs on an engine of its
//    source GPU (ROCr's copy agent is the source; the status mask is of its
//    engines), so links out of one GPU get distinct engines where the masks
//    allow (its concurrent peer copies then run on distinct engines). Links
//    with the fewest choices are served first; where no distinct engine is
//    left, the source's least-used one of the link's mask is shared
//    (counted in shared_links()).
//  - A link whose status call failed or whose mask is empty after the skip
//    mask gets no engine: its copies keep ROCr's choice, with the reason.
//
// Threads: built once at engine start; immutable after (any thread reads).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dmagather::server::engines::gpu::hip {

// A PCI address as HSA reports it (HSA_AMD_AGENT_INFO_DOMAIN, _BDFID:
// bus << 8 | device << 3 | function) and HIP's hipDeviceGetPCIBusId
// ("dddd:bb:dd.f") parses to.
struct PciAddress {
  uint32_t domain = 0;
  uint32_t bdf = 0;
  bool operator==(const PciAddress& o) const { return domain == o.domain && bdf == o.bdf; }
};

// "0000:c1:00.0" -> {0, 0xc100}; an error for anything else.
absl::StatusOr<PciAddress> ParsePciBusId(const std::string& text);

// agent_of[device] = index into `agents` with the same PCI address; an
// error naming the device when none or several match.
absl::StatusOr<std::vector<int>> MatchDevicesToAgents(const std::vector<PciAddress>& devices,
                                                      const std::vector<PciAddress>& agents);

class SdmaEnginePlan {
 public:
  // The engines HSA reports available for copies into `dst` from `src`
  // (device ordinals): a mask of hsa_amd_sdma_engine_id_t bits, or an error.
  using EngineStatus = std::function<absl::StatusOr<uint32_t>(int dst, int src)>;

  // `skip_mask`: engines never to use (the operator's, on top of the driver's).
  static SdmaEnginePlan Build(int num_devices, const EngineStatus& status, uint32_t skip_mask);
  // No engine for any link: ROCr chooses, for `reason`.
  static SdmaEnginePlan RocrChoice(int num_devices, std::string reason);

  // The engine bit for copies into dst from src; 0: ROCr's choice.
  uint32_t EngineFor(int dst, int src) const;
  // Why EngineFor(dst, src) is 0 ("" when it is not).
  const std::string& WhyRocr(int dst, int src) const;
  int num_devices() const { return n_; }
  int assigned_links() const { return assigned_; }
  int shared_links() const { return shared_; }
  // One line per link for the start-up log ("1<-0: engine 2", "2<-0: ROCr (...)").
  std::string Describe() const;

 private:
  explicit SdmaEnginePlan(int n) : n_(n), engine_(n * n, 0), why_(n * n) {}

  int n_;
  std::vector<uint32_t> engine_;
  std::vector<std::string> why_;
  int assigned_ = 0;
  int shared_ = 0;
};

}  // namespace dmagather::server::engines::gpu::hip

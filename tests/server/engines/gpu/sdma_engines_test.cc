// SdmaEnginePlan and the device-to-agent match (server/engines/gpu/
// sdma_engines.h) on masks and PCI addresses as HSA would report them: which
// engine each link gets, what happens to engines the driver or the operator
// rules out, failed status calls, scarce engines, and sliced device lists.
#include "server/engines/gpu/hip/sdma_engines.h"

#include <gtest/gtest.h>

#include <map>
#include <utility>

namespace dmagather::server::engines::gpu::hip {
namespace {

SdmaEnginePlan::EngineStatus All(uint32_t mask) {
  return [mask](int, int) -> absl::StatusOr<uint32_t> { return mask; };
}

// For every device, the engines of the links out of it (its engines: a
// copy between GPUs runs on its source's).
void ExpectDistinctPerSource(const SdmaEnginePlan& p) {
  for (int d = 0; d < p.num_devices(); ++d) {
    std::map<uint32_t, std::pair<int, int>> seen;
    for (int a = 0; a < p.num_devices(); ++a) {
      for (int b = 0; b < p.num_devices(); ++b) {
        if (a == b || b != d) continue;
        const uint32_t e = p.EngineFor(a, b);
        ASSERT_NE(e, 0u);
        auto [it, fresh] = seen.emplace(e, std::make_pair(a, b));
        EXPECT_TRUE(fresh) << "device " << d << ": links " << a << "<-" << b << " and " << it->second.first << "<-"
                           << it->second.second << " share engine bit 0x" << std::hex << e;
      }
    }
  }
}

TEST(SdmaEnginePlan, EachLinkGetsAFixedEngineDistinctFromItsSourcesOtherLinks) {
  const SdmaEnginePlan p = SdmaEnginePlan::Build(4, All(0xFFFF), 0);
  EXPECT_EQ(p.assigned_links(), 12);
  EXPECT_EQ(p.shared_links(), 0);
  ExpectDistinctPerSource(p);
  // Deterministic: the source's lowest free engine, links in (dst, src) order.
  EXPECT_EQ(p.EngineFor(0, 1), 0x1u);
  EXPECT_EQ(p.EngineFor(0, 2), 0x1u);  // Another source GPU: its own engine 0.
  EXPECT_EQ(p.EngineFor(0, 3), 0x1u);
  EXPECT_EQ(p.EngineFor(1, 0), 0x1u);
  EXPECT_EQ(p.EngineFor(1, 2), 0x2u);  // Device 2's engine 0 runs 0<-2.
  EXPECT_EQ(p.EngineFor(2, 0), 0x2u);
  EXPECT_EQ(p.EngineFor(3, 0), 0x4u);
  EXPECT_EQ(p.EngineFor(0, 0), 0u);  // Same device: not a link.
  EXPECT_EQ(SdmaEnginePlan::Build(4, All(0xFFFF), 0).Describe(), p.Describe());
}

TEST(SdmaEnginePlan, EnginesTheDriverOrTheOperatorRulesOutAreNeverUsed) {
  // Link 1<-0 does not have engine 0 (fused off there); engine 1 is skipped
  // by the operator everywhere.
  auto status = [](int dst, int src) -> absl::StatusOr<uint32_t> { return dst == 1 && src == 0 ? 0xFFFE : 0xFFFF; };
  const SdmaEnginePlan p = SdmaEnginePlan::Build(3, status, /*skip_mask=*/0x2);
  for (int a = 0; a < 3; ++a) {
    for (int b = 0; b < 3; ++b) {
      if (a == b) continue;
      EXPECT_EQ(p.EngineFor(a, b) & 0x2, 0u) << a << "<-" << b;
    }
  }
  EXPECT_EQ(p.EngineFor(1, 0) & 0x1, 0u);
  ExpectDistinctPerSource(p);
}

TEST(SdmaEnginePlan, AFailedOrEmptyLinkKeepsRocrsChoiceWithTheReason) {
  auto status = [](int dst, int src) -> absl::StatusOr<uint32_t> {
    if (dst == 2 && src == 3) return absl::ResourceExhaustedError("HSA_STATUS_ERROR_OUT_OF_RESOURCES");
    if (dst == 3 && src == 2) return 0x4;  // Only engine 2, which the operator skips.
    return 0xFF;
  };
  const SdmaEnginePlan p = SdmaEnginePlan::Build(4, status, 0x4);
  EXPECT_EQ(p.EngineFor(2, 3), 0u);
  EXPECT_EQ(p.WhyRocr(2, 3), "hsa_amd_memory_copy_engine_status failed: HSA_STATUS_ERROR_OUT_OF_RESOURCES");
  EXPECT_EQ(p.EngineFor(3, 2), 0u);
  EXPECT_EQ(p.WhyRocr(3, 2), "no usable SDMA engine (driver reports 0x4, skipped 0x4)");
  EXPECT_EQ(p.assigned_links(), 10);
  EXPECT_NE(p.EngineFor(2, 1), 0u);
  EXPECT_EQ(p.WhyRocr(2, 1), "");
  EXPECT_NE(p.Describe().find("2<-3: ROCr (hsa_amd_memory_copy_engine_status failed"), std::string::npos)
      << p.Describe();
}

TEST(SdmaEnginePlan, ScarceEnginesAreSharedEvenlyAndCounted) {
  // 5 devices, 2 engines each: every GPU has 4 links out, so two of them
  // share an engine; each engine carries 2 of its links.
  const SdmaEnginePlan p = SdmaEnginePlan::Build(5, All(0x3), 0);
  EXPECT_EQ(p.assigned_links(), 20);
  EXPECT_EQ(p.shared_links(), 10);
  for (int src = 0; src < 5; ++src) {
    int on[2] = {0, 0};
    for (int dst = 0; dst < 5; ++dst) {
      if (dst == src) continue;
      const uint32_t e = p.EngineFor(dst, src);
      ASSERT_TRUE(e == 0x1 || e == 0x2) << e;
      ++on[e == 0x1 ? 0 : 1];
    }
    EXPECT_EQ(on[0], 2) << "source " << src;
    EXPECT_EQ(on[1], 2) << "source " << src;
  }
}

TEST(SdmaEnginePlan, LinksWithFewestChoicesAreServedFirst) {
  // 2<-0 can only use engine 0; served first, it gets it although 1<-0
  // comes earlier in (dst, src) order and could use engine 0 too.
  auto status = [](int dst, int src) -> absl::StatusOr<uint32_t> { return dst == 2 && src == 0 ? 0x1 : 0x3; };
  const SdmaEnginePlan p = SdmaEnginePlan::Build(3, status, 0);
  EXPECT_EQ(p.EngineFor(2, 0), 0x1u);
  EXPECT_EQ(p.EngineFor(1, 0), 0x2u);
}

TEST(SdmaEnginePlan, RocrChoiceForEveryLink) {
  const SdmaEnginePlan p = SdmaEnginePlan::RocrChoice(2, "no hsa_amd_memory_async_copy_on_engine (ROCm < 5.7)");
  EXPECT_EQ(p.EngineFor(0, 1), 0u);
  EXPECT_EQ(p.WhyRocr(1, 0), "no hsa_amd_memory_async_copy_on_engine (ROCm < 5.7)");
  EXPECT_EQ(p.assigned_links(), 0);
}

TEST(SdmaDevices, ParsesPciBusIds) {
  auto a = ParsePciBusId("0000:c1:00.0");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->domain, 0u);
  EXPECT_EQ(a->bdf, 0xc100u);
  auto b = ParsePciBusId("0001:0a:1f.7");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->domain, 1u);
  EXPECT_EQ(b->bdf, (0x0au << 8) | (0x1fu << 3) | 7u);
  EXPECT_FALSE(ParsePciBusId("c1:00.0x").ok());
  EXPECT_FALSE(ParsePciBusId("").ok());
}

TEST(SdmaDevices, DevicesMatchAgentsByPciAddressNotPosition) {
  // 8 GPUs; this process sees only two of them (HIP_VISIBLE_DEVICES=2,5):
  // its devices 0 and 1 are agents 2 and 5, not 0 and 1.
  std::vector<PciAddress> agents;
  for (uint32_t i = 0; i < 8; ++i) agents.push_back(PciAddress{0, (0x11 + 0x10 * i) << 8});
  auto m = MatchDevicesToAgents({agents[2], agents[5]}, agents);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, (std::vector<int>{2, 5}));
}

TEST(SdmaDevices, ADeviceWithoutExactlyOneAgentIsRefusedWithTheReason) {
  const std::vector<PciAddress> agents = {{0, 0x1100}, {0, 0x2100}};
  auto missing = MatchDevicesToAgents({{0, 0x3100}}, agents);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("HIP device 0 (PCI 0000:31:00.0) matches 0 of the 2 HSA GPU agents"),
            std::string::npos)
      << missing.status();
  auto twice = MatchDevicesToAgents({{0, 0x1100}}, {{0, 0x1100}, {0, 0x1100}});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("matches 2 of the 2"), std::string::npos) << twice.status();
}

}  // namespace
}  // namespace dmagather::server::engines::gpu::hip

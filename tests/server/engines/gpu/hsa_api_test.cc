// The set-up of dmagatherd's own SDMA engines (server/engines/gpu/hip/hsa_api.h)
// on a fake HSA table: HIP devices matched to HSA GPU agents by PCI address
// whatever order HSA lists them in (a CPU agent among them), engines per
// link from what the fake driver reports, the reasons it leaves the copies
// to ROCr, the operator's skip mask, and the library loader's refusal.
#include "server/engines/gpu/hip/hsa_api.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace dmagather::server::engines::gpu::hip {
namespace {

struct FakeAgent {
  uint64_t handle;
  hsa_device_type_t type;
  uint32_t domain, bdf;
};
struct FakeNode {
  std::vector<FakeAgent> agents;
  // (dst handle, src handle) -> engines reported usable.
  std::map<std::pair<uint64_t, uint64_t>, uint32_t> masks;
  std::vector<std::pair<uint64_t, uint64_t>> copies_on;  // (src agent, engine bit).
};
FakeNode* node = nullptr;

hsa_status_t Iterate(hsa_status_t (*cb)(hsa_agent_t, void*), void* data) {
  for (const FakeAgent& a : node->agents) {
    if (hsa_status_t st = cb(hsa_agent_t{a.handle}, data); st != HSA_STATUS_SUCCESS) return st;
  }
  return HSA_STATUS_SUCCESS;
}
hsa_status_t GetInfo(hsa_agent_t agent, hsa_agent_info_t attr, void* value) {
  for (const FakeAgent& a : node->agents) {
    if (a.handle != agent.handle) continue;
    if (attr == HSA_AGENT_INFO_DEVICE) {
      *static_cast<hsa_device_type_t*>(value) = a.type;
    } else if (attr == static_cast<hsa_agent_info_t>(HSA_AMD_AGENT_INFO_DOMAIN)) {
      *static_cast<uint32_t*>(value) = a.domain;
    } else if (attr == static_cast<hsa_agent_info_t>(HSA_AMD_AGENT_INFO_BDFID)) {
      *static_cast<uint32_t*>(value) = a.bdf;
    } else {
      return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    }
    return HSA_STATUS_SUCCESS;
  }
  return HSA_STATUS_ERROR_INVALID_AGENT;
}
hsa_status_t Status(hsa_agent_t dst, hsa_agent_t src, uint32_t* mask) {
  auto it = node->masks.find({dst.handle, src.handle});
  if (it == node->masks.end()) return HSA_STATUS_ERROR_INVALID_AGENT;
  *mask = it->second;
  return HSA_STATUS_SUCCESS;
}
hsa_status_t Create(hsa_signal_value_t, uint32_t, const hsa_agent_t*, hsa_signal_t* s) {
  static uint64_t next = 1;
  s->handle = next++;
  return HSA_STATUS_SUCCESS;
}
hsa_status_t Destroy(hsa_signal_t) { return HSA_STATUS_SUCCESS; }
hsa_status_t OnEngine(void*, hsa_agent_t, const void*, hsa_agent_t src, size_t, uint32_t, const hsa_signal_t*,
                      hsa_signal_t, uint32_t engine, bool) {
  node->copies_on.push_back({src.handle, engine});
  return HSA_STATUS_SUCCESS;
}
hsa_status_t AsyncCopy(void*, hsa_agent_t, const void*, hsa_agent_t src, size_t, uint32_t, const hsa_signal_t*,
                       hsa_signal_t) {
  node->copies_on.push_back({src.handle, 0});
  return HSA_STATUS_SUCCESS;
}

class OwnSdmaEnginesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node = &node_;
    api_.iterate_agents = Iterate;
    api_.agent_get_info = GetInfo;
    api_.copy_engine_status = Status;
    api_.copy = HsaCopyApi{Create, Destroy, nullptr, nullptr, AsyncCopy, OnEngine};
    // HSA lists a CPU agent and the GPUs in another order than HIP: agent
    // 11 is PCI 0000:c1:00.0, agent 12 is 0000:41:00.0.
    node_.agents = {
        {10, HSA_DEVICE_TYPE_CPU, 0, 0}, {11, HSA_DEVICE_TYPE_GPU, 0, 0xc100}, {12, HSA_DEVICE_TYPE_GPU, 0, 0x4100}};
  }
  void TearDown() override { node = nullptr; }

  FakeNode node_;
  HsaApi api_;
};

TEST_F(OwnSdmaEnginesTest, DevicesAreMatchedToAgentsByPciAddressAndEachLinkGetsAUsableEngine) {
  node_.masks[{12, 11}] = 0x6;  // Into HIP device 0 (agent 12) from device 1 (agent 11): engines 1, 2.
  node_.masks[{11, 12}] = 0x1;  // Into device 1 from device 0: engine 0 only.
  auto hs = OwnSdmaEngines(&api_, {"0000:41:00.0", "0000:c1:00.0"}, 0);
  ASSERT_TRUE(hs.ok()) << hs.status();
  EXPECT_EQ((*hs)->plan().assigned_links(), 2);
  EXPECT_EQ((*hs)->plan().EngineFor(0, 1), 0x2u);
  EXPECT_EQ((*hs)->plan().EngineFor(1, 0), 0x1u);
  char buf[8];
  HsaStreams::Stream* s = (*hs)->CreateStream(0);
  CopyCmd c{buf, buf, 8, 1, 0};
  c.dst_device = 0;
  c.src_device = 1;
  ASSERT_TRUE((*hs)->Copy(s, &c, 1).ok());
  ASSERT_EQ(node_.copies_on.size(), 1u);
  EXPECT_EQ(node_.copies_on[0].first, 11u);  // Device 1's agent, whatever its place in HSA's list.
  EXPECT_EQ(node_.copies_on[0].second, 0x2u);
}

TEST_F(OwnSdmaEnginesTest, TheSkipMaskRemovesEnginesAndAnEmptyLinkIsRocrsChoice) {
  node_.masks[{12, 11}] = 0x6;
  node_.masks[{11, 12}] = 0x1;
  auto hs = OwnSdmaEngines(&api_, {"0000:41:00.0", "0000:c1:00.0"}, /*skip_mask=*/0x3);
  ASSERT_TRUE(hs.ok()) << hs.status();
  EXPECT_EQ((*hs)->plan().EngineFor(0, 1), 0x4u);
  EXPECT_EQ((*hs)->plan().EngineFor(1, 0), 0u);
  EXPECT_NE((*hs)->plan().WhyRocr(1, 0).find("no usable SDMA engine"), std::string::npos)
      << (*hs)->plan().WhyRocr(1, 0);
}

TEST_F(OwnSdmaEnginesTest, NoUsableEngineOnAnyLinkLeavesTheNodeToRocr) {
  node_.masks[{12, 11}] = 0;
  node_.masks[{11, 12}] = 0;
  auto hs = OwnSdmaEngines(&api_, {"0000:41:00.0", "0000:c1:00.0"}, 0);
  ASSERT_FALSE(hs.ok());
  EXPECT_NE(hs.status().message().find("no peer link has a usable SDMA engine"), std::string::npos) << hs.status();
}

TEST_F(OwnSdmaEnginesTest, ADeviceWithoutItsAgentLeavesTheNodeToRocr) {
  // HIP sees a GPU that HSA does not list (sliced visible devices).
  auto hs = OwnSdmaEngines(&api_, {"0000:41:00.0", "0000:e1:00.0"}, 0);
  ASSERT_FALSE(hs.ok());
  EXPECT_NE(hs.status().message().find("HSA GPU agents"), std::string::npos) << hs.status();
}

TEST_F(OwnSdmaEnginesTest, ARuntimeWithoutEngineChoiceIsRefused) {
  api_.copy.copy_on_engine = nullptr;  // ROCm < 5.7.
  auto hs = OwnSdmaEngines(&api_, {"0000:41:00.0", "0000:c1:00.0"}, 0);
  ASSERT_FALSE(hs.ok());
  EXPECT_NE(hs.status().message().find("ROCm < 5.7"), std::string::npos) << hs.status();
}

TEST_F(OwnSdmaEnginesTest, OneDeviceHasNoLinkToOwn) {
  auto hs = OwnSdmaEngines(&api_, {"0000:41:00.0"}, 0);
  EXPECT_FALSE(hs.ok());
}

TEST(HsaLoaderTest, AMissingLibraryIsUnavailableWithTheReason) {
  auto lib = LoadHsa({"/nonexistent/libhsa-runtime64.so.1"});
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(lib.status().message().find("/nonexistent/libhsa-runtime64.so.1"), std::string::npos);
}

TEST(HsaLoaderTest, EngineMasks) {
  EXPECT_EQ(*ParseEngineMask(""), 0u);
  EXPECT_EQ(*ParseEngineMask("0x6"), 6u);
  EXPECT_EQ(*ParseEngineMask("c0"), 0xc0u);
  EXPECT_FALSE(ParseEngineMask("engines").ok());
  EXPECT_FALSE(ParseEngineMask("0x").ok());
}

}  // namespace
}  // namespace dmagather::server::engines::gpu::hip

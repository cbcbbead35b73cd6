#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "common/hip/hip_api.h"
#include "server/engines/engine_registry.h"
#include "server/engines/factory.h"

namespace dmagather::server::engines {
namespace {

bool HaveAmdGpu() { return ::dmagather::common::hip::HipAvailable().ok(); }

TEST(HipBackendSelection, LoadingHipWithoutAnAmdGpuNeitherCrashesNorHangs) {
  const auto t0 = std::chrono::steady_clock::now();
  auto n = ::dmagather::common::hip::HipAvailable();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  if (n.ok()) GTEST_SKIP() << *n << " AMD GPU(s) present";
  EXPECT_EQ(n.status().code(), absl::StatusCode::kUnavailable) << n.status();
  // Asked again: the same answer, at once.
  EXPECT_EQ(::dmagather::common::hip::HipAvailable().status(), n.status());
}

// The GPU backends keep their threads awake while a job is active unless
// the operator says otherwise (--stay_awake_us=-1 resolves to this).
TEST(HipBackendSelection, GpuBackendsStayAwakeByDefault) {
  int gpu = 0;
  for (const EngineBackend& b : RegisteredEngines()) {
    if (b.name == "host") {
      EXPECT_EQ(b.default_stay_awake_ns, 0) << "ranks and daemon share the cores";
    } else {
      EXPECT_EQ(b.default_stay_awake_ns, kGpuStayAwakeNs) << b.name;
      ++gpu;
    }
  }
  EXPECT_GE(gpu, 1) << "this test's binary registers hip";
}

TEST(HipBackendSelection, HipFailsUnavailableWhenNoAmdGpu) {
  if (HaveAmdGpu()) GTEST_SKIP() << "an AMD GPU is present";
  EngineOptions o;
  o.backend = "hip";
  auto e = CreateEngine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnavailable) << e.status();
  const std::string m(e.status().message());
  EXPECT_EQ(m.find("--backend=hip: cannot use HIP: "), 0u) << m;
  if (::dmagather::common::hip::Hip().ok()) {
    // libamdhip64 loaded (as on the build machines): the device count says why.
    EXPECT_NE(m.find("hipGetDeviceCount: hipErrorNoDevice"), std::string::npos) << m;
    EXPECT_NE(m.find("no AMD GPU is visible"), std::string::npos) << m;
  } else {
    EXPECT_NE(m.find("cannot load libamdhip64.so."), std::string::npos) << m;
  }
}

TEST(HipBackendSelection, AutoTriesHipThenCudaThenHostAndSaysWhy) {
  const auto backends = RegisteredEngines();
  ASSERT_GE(backends.size(), 2u);
  EXPECT_EQ(backends[0].name, "hip");
  EXPECT_EQ(backends.back().name, "host");
  if (HaveAmdGpu()) GTEST_SKIP() << "an AMD GPU is present";
  EngineOptions o;
  o.backend = "auto";
  auto e = CreateEngine(o);
  ASSERT_TRUE(e.ok()) << e.status();
  const std::string& r = e->reason;
  EXPECT_EQ(r.find("auto: no usable AMD GPU ("), 0u) << r;
  if (std::string(e->engine->name()) == "host") {
    EXPECT_NE(r.find(", using host"), std::string::npos) << r;
    const size_t cuda = r.find("no usable CUDA GPU");
    if (cuda != std::string::npos) {
      EXPECT_GT(cuda, r.find("no usable AMD GPU")) << r;
    }
  } else {
    EXPECT_STREQ(e->engine->name(), "cuda");
    EXPECT_NE(r.find(", using cuda"), std::string::npos) << r;
  }
}

}  // namespace
}  // namespace dmagather::server::engines

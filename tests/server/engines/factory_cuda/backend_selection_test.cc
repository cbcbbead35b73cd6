#include <gtest/gtest.h>

#include <string>

#include "common/cuda/cuda_api.h"
#include "server/engines/factory.h"

namespace dmagather::server::engines {
namespace {

bool HaveGpu() { return ::dmagather::common::cuda::CudaAvailable().ok(); }

TEST(BackendSelection, AutoPicksHostWithTheReasonWhenNoGpu) {
  if (HaveGpu()) GTEST_SKIP() << "a CUDA GPU is present";
  EngineOptions o;
  o.backend = "auto";
  auto e = CreateEngine(o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_STREQ(e->engine->name(), "host");
  // (hip, where the build has it, is tried first and named before cuda.)
  EXPECT_EQ(e->reason.find("auto: no usable "), 0u) << e->reason;
  EXPECT_NE(e->reason.find("no usable CUDA GPU"), std::string::npos) << e->reason;
  EXPECT_NE(e->reason.find("cudaGetDeviceCount"), std::string::npos) << e->reason;
}

TEST(BackendSelection, CudaFailsClearlyWhenNoGpu) {
  if (HaveGpu()) GTEST_SKIP() << "a CUDA GPU is present";
  EngineOptions o;
  o.backend = "cuda";
  auto e = CreateEngine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--backend=cuda: cannot use CUDA: no NVIDIA driver (libcuda.so.1) on this "
                                      "machine (cudaGetDeviceCount: cudaError"),
            std::string::npos)
      << e.status();
}

TEST(BackendSelection, HostStillHost) {
  EngineOptions o;
  o.backend = "host";
  auto e = CreateEngine(o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_STREQ(e->engine->name(), "host");
  EXPECT_EQ(e->reason, "--backend=host");
}

}  // namespace
}  // namespace dmagather::server::engines

// CUDA errors become statuses naming the call and the code; without a
// driver, availability and the driver table fail cleanly (no crash).
#include "common/cuda/cuda_api.h"

#include <gtest/gtest.h>

namespace dmagather::common::cuda {
namespace {

TEST(CudaApi, StatusNamesCallAndCode) {
  absl::Status st = CudaStatus("cudaIpcOpenMemHandle", cudaErrorInvalidValue);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "cudaIpcOpenMemHandle: cudaErrorInvalidValue (invalid argument)");
  EXPECT_TRUE(CudaStatus("x", cudaSuccess).ok());
  EXPECT_EQ(CudaStatus("cudaMalloc", cudaErrorMemoryAllocation).code(), absl::StatusCode::kResourceExhausted);
}

TEST(CudaApi, NoDriverFailsCleanly) {
  auto n = CudaAvailable();
  if (n.ok()) GTEST_SKIP() << *n << " CUDA device(s) present";
  EXPECT_NE(n.status().message().find("cudaGetDeviceCount"), std::string::npos) << n.status();
  auto d = Driver();
  EXPECT_FALSE(d.ok());
  EXPECT_EQ(d.status(), n.status());
}

}  // namespace
}  // namespace dmagather::common::cuda

#include "server/service/wait_spin.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace dmagather::server::service {
namespace {

TEST(WaitSpinTest, SpinsOnlyWhenEveryRankAndTheDaemonHaveACore) {
  EXPECT_EQ(AdvisedWaitSpin(16, 4), kWaitSpinSpareCores);
  EXPECT_EQ(AdvisedWaitSpin(16, 14), kWaitSpinSpareCores);
  EXPECT_EQ(AdvisedWaitSpin(16, 15), 0u);
  EXPECT_EQ(AdvisedWaitSpin(2, 4), 0u);
  EXPECT_EQ(AdvisedWaitSpin(2, 1), 0u);
  EXPECT_EQ(AdvisedWaitSpin(3, 1), kWaitSpinSpareCores);
}

TEST(WaitSpinTest, CgroupQuotaInCpus) {
  EXPECT_EQ(CpusFromCpuMax("200000 100000"), 2);
  EXPECT_EQ(CpusFromCpuMax("150000 100000"), 2);  // Rounded up.
  EXPECT_EQ(CpusFromCpuMax("50000 100000"), 1);
  EXPECT_EQ(CpusFromCpuMax("max 100000"), 0);  // No limit.
  EXPECT_EQ(CpusFromCpuMax(""), 0);
  EXPECT_EQ(CpusFromCpuMax("junk"), 0);
  EXPECT_EQ(CpusFromCpuMax("100000 0"), 0);
}

TEST(WaitSpinTest, UsableCpusIsWithinTheOnlineCount) {
  const int n = UsableCpus();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, static_cast<int>(sysconf(_SC_NPROCESSORS_CONF)));
}

}  // namespace
}  // namespace dmagather::server::service

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

TEST(WaitSpinTest, UsableCpusIsWithinTheOnlineCount) {
  const int n = UsableCpus();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, static_cast<int>(sysconf(_SC_NPROCESSORS_CONF)));
}

}  // namespace
}  // namespace dmagather::server::service

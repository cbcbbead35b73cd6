// FairShare: one user's flood fills its own share and never keeps another
// user out of the table.
#include "server/service/fair_share.h"

#include <gtest/gtest.h>

namespace dmagather::server::service {
namespace {

using V = FairShare::Verdict;

TEST(FairShareTest, AUserIsCappedAtItsShare) {
  FairShare fs(/*total=*/100, /*per_uid=*/4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(fs.Decide(1000).verdict, V::kAdmit);
    fs.Add(1000);
  }
  const FairShare::Decision d = fs.Decide(1000);
  EXPECT_EQ(d.verdict, V::kRefuse);
  EXPECT_NE(d.why.find("uid 1000"), std::string::npos) << d.why;
  EXPECT_EQ(fs.Decide(0).verdict, V::kAdmit) << "another user is not held back by uid 1000's share";
  fs.Remove(1000);
  EXPECT_EQ(fs.Decide(1000).verdict, V::kAdmit);
}

TEST(FairShareTest, AFullTableEvictsTheBiggestHolderForANewUser) {
  FairShare fs(/*total=*/8, /*per_uid=*/0);  // No per-user cap: only the full table decides.
  for (int i = 0; i < 8; ++i) fs.Add(65534);
  ASSERT_EQ(fs.total_used(), 8);
  const FairShare::Decision d = fs.Decide(0);
  EXPECT_EQ(d.verdict, V::kEvict);
  EXPECT_EQ(d.evict_uid, 65534u);
  // After the eviction both hold slots; the flooder cannot take them back
  // once it no longer holds more than the other would.
  fs.Remove(65534);
  fs.Add(0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(fs.Decide(0).verdict, V::kEvict) << i;
    fs.Remove(65534);
    fs.Add(0);
  }
  EXPECT_EQ(fs.count(0), 4);
  EXPECT_EQ(fs.count(65534), 4);
  EXPECT_EQ(fs.Decide(0).verdict, V::kRefuse) << "equal shares: nobody is evicted for uid 0's fifth";
  EXPECT_EQ(fs.Decide(65534).verdict, V::kRefuse);
}

TEST(FairShareTest, CountsReturnToZero) {
  FairShare fs(4, 2);
  fs.Add(1);
  fs.Add(2);
  fs.Remove(1);
  fs.Remove(2);
  fs.Remove(3);  // Unknown: ignored.
  EXPECT_EQ(fs.total_used(), 0);
  EXPECT_EQ(fs.uids(), 0);
}

}  // namespace
}  // namespace dmagather::server::service

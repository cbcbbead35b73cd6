// TicketTable on a FakeClock: expiry decided by moved time, never by sleeping.
#include "server/service/ticket_table.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "abi/fd_channel_v1.h"
#include "tests/fakes/fake_clock.h"

namespace dmagather::server::service {
namespace {

Handover Segment(uid_t uid, pid_t pid) {
  Handover h;
  h.kind = abi::kFdSegment;
  h.uid = uid;
  h.pid = pid;
  h.bytes = 4096;
  return h;
}

TEST(TicketTableTest, ATicketLivesExactlyItsTtl) {
  common::testing::FakeClock clock;
  TicketTable::Options o;
  o.ttl = absl::Seconds(5);
  o.clock = &clock;
  TicketTable t(o);
  auto a = t.Issue(Segment(1000, 42));
  auto b = t.Issue(Segment(1000, 42));
  ASSERT_TRUE(a.ok() && b.ok());
  clock.Advance(absl::Seconds(5) - absl::Nanoseconds(1));
  auto taken = t.Take(*a, abi::kFdSegment);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->uid, 1000u);
  EXPECT_EQ(taken->pid, 42);
  clock.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(t.Take(*b, abi::kFdSegment).status().code(), absl::StatusCode::kNotFound) << "expired at its ttl";
  EXPECT_EQ(t.Take(*a, abi::kFdSegment).status().code(), absl::StatusCode::kNotFound) << "spent";
}

TEST(TicketTableTest, ExpireDropsOnlyExpiredOnes) {
  common::testing::FakeClock clock;
  TicketTable::Options o;
  o.ttl = absl::Seconds(2);
  o.clock = &clock;
  TicketTable t(o);
  ASSERT_TRUE(t.Issue(Segment(1, 1)).ok());
  clock.Advance(absl::Seconds(1));
  auto young = t.Issue(Segment(1, 1));
  ASSERT_TRUE(young.ok());
  clock.Advance(absl::Seconds(1));
  t.Expire();
  EXPECT_EQ(t.size(), 1u);
  EXPECT_TRUE(t.Take(*young, abi::kFdSegment).ok());
}

TEST(TicketTableTest, ExpiredTicketsDoNotCountAgainstTheUserLimit) {
  common::testing::FakeClock clock;
  TicketTable::Options o;
  o.ttl = absl::Seconds(1);
  o.max_per_uid = 2;
  o.clock = &clock;
  TicketTable t(o);
  ASSERT_TRUE(t.Issue(Segment(7, 1)).ok());
  ASSERT_TRUE(t.Issue(Segment(7, 1)).ok());
  EXPECT_EQ(t.Issue(Segment(7, 1)).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(t.Issue(Segment(8, 1)).ok()) << "another uid has its own limit";
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(t.Issue(Segment(7, 1)).ok()) << "the expired two no longer count";
}

TEST(TicketTableTest, AKindMismatchSpendsTheTicket) {
  TicketTable t;
  auto a = t.Issue(Segment(1, 1));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(t.Take(*a, abi::kFdBuffer).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.Take(*a, abi::kFdSegment).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dmagather::server::service

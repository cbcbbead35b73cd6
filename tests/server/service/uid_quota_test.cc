// UidQuota: a reservation counts while it lives, against its own uid only,
// and goes back exactly once however it ends (destroyed, Reset, moved).
#include "server/service/uid_quota.h"

#include <gtest/gtest.h>

#include <optional>
#include <utility>
#include <vector>

namespace dmagather::server::service {
namespace {

TEST(UidQuotaTest, SessionsUpToTheLimitThenRefusedNamingTheFlag) {
  auto quota = UidQuota::Create({/*max_jobs_per_uid=*/0, /*max_sessions_per_uid=*/2});
  std::vector<UidQuota::Reservation> held;
  for (int i = 0; i < 2; ++i) {
    auto r = quota->ReserveSession(10);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->held());
    held.push_back(*std::move(r));
  }
  auto third = quota->ReserveSession(10);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("--max_sessions_per_uid"), std::string::npos) << third.status();
  EXPECT_NE(third.status().message().find("uid 10"), std::string::npos) << third.status();
  EXPECT_EQ(quota->held(10).sessions, 2) << "a refusal counts nothing";
  EXPECT_TRUE(quota->ReserveSession(11).ok()) << "another uid has its own count";
  held.pop_back();
  EXPECT_EQ(quota->held(10).sessions, 1);
  EXPECT_TRUE(quota->ReserveSession(10).ok());
}

TEST(UidQuotaTest, JobsAreCountedApartFromSessions) {
  auto quota = UidQuota::Create({/*max_jobs_per_uid=*/1, /*max_sessions_per_uid=*/0});
  auto job = quota->ReserveJob(7, "a");
  ASSERT_TRUE(job.ok());
  auto session = quota->ReserveSession(7);
  ASSERT_TRUE(session.ok()) << "sessions are unlimited";
  auto second = quota->ReserveJob(7, "b");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(second.status().message().find("job 'b' was not created"), std::string::npos) << second.status();
  EXPECT_EQ(quota->held(7).jobs, 1);
  EXPECT_EQ(quota->held(7).sessions, 1);
  job->Reset();
  EXPECT_FALSE(job->held());
  EXPECT_EQ(quota->held(7).jobs, 0);
  EXPECT_EQ(quota->held(7).sessions, 1);
  job->Reset();  // Once only.
  EXPECT_EQ(quota->held(7).sessions, 1);
  EXPECT_TRUE(quota->ReserveJob(7, "b").ok());
}

TEST(UidQuotaTest, AMovedReservationIsGivenBackOnceByItsLastOwner) {
  auto quota = UidQuota::Create({0, 0});
  std::optional<UidQuota::Reservation> a = *quota->ReserveSession(3);
  UidQuota::Reservation b = std::move(*a);
  EXPECT_FALSE(a->held());
  EXPECT_TRUE(b.held());
  a.reset();
  EXPECT_EQ(quota->held(3).sessions, 1) << "the moved-from one gives nothing back";
  UidQuota::Reservation c = *quota->ReserveSession(3);
  EXPECT_EQ(quota->held(3).sessions, 2);
  c = std::move(b);  // c's own count goes back; b's moves in.
  EXPECT_EQ(quota->held(3).sessions, 1);
  c = UidQuota::Reservation();
  EXPECT_EQ(quota->held(3).sessions, 0);
  EXPECT_EQ(quota->uids(), 0) << "a uid holding nothing is forgotten";
}

TEST(UidQuotaTest, AReservationOutlivesItsOwnersHandle) {
  auto quota = UidQuota::Create({0, 1});
  UidQuota* raw = quota.get();
  UidQuota::Reservation r = *quota->ReserveSession(1);
  quota.reset();  // The registry is gone; the reservation keeps the quota.
  EXPECT_EQ(raw->held(1).sessions, 1);
  r.Reset();
}

TEST(UidQuotaTest, ZeroMeansNoLimit) {
  auto quota = UidQuota::Create({0, 0});
  std::vector<UidQuota::Reservation> held;
  for (int i = 0; i < 1000; ++i) held.push_back(*quota->ReserveSession(1));
  EXPECT_EQ(quota->held(1).sessions, 1000);
  held.clear();
  EXPECT_EQ(quota->held(1).sessions, 0);
}

}  // namespace
}  // namespace dmagather::server::service

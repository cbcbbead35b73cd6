// IssueWatch on a fake clock: a driver call over the limit is reported once,
// with every device's issuer (its op, step and time) and every rank's ready
// and done words of that op; a call under the limit, or ended, is not.
#include "server/engines/gpu/issue_watch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "server/engines/copy_engine.h"
#include "tests/fakes/fake_clock.h"

namespace dmagather::server::engines::gpu {
namespace {

// A rank whose words the test sets.
struct TestRank : EngineRank {
  uint32_t ready = 0, done = 0;
};

IssueWatch::Words WordsOf(const EngineRank* r) {
  const auto* k = static_cast<const TestRank*>(r);
  return IssueWatch::Words{&k->ready, &k->done};
}

TEST(IssueWatchTest, ACallOverTheLimitIsReportedOnceWithEveryIssuerAndRank) {
  common::testing::FakeClock clock;
  IssueWatch watch(3, clock, WordsOf, /*limit_ns=*/1'000'000'000ull);
  TestRank r0, r1;
  r0.ready = 7, r0.done = 6, r1.ready = 6, r1.done = 6;
  struct Op : EngineOp {
    void OnEngineDone(absl::Status) override {}
  } o;
  o.seq = 7;
  o.job_id = 3;
  o.ranks = {&r0, &r1};
  watch.Begin(0, &o, "copy calls");
  watch.Begin(1, &o, "ready waits");
  clock.Advance(absl::Milliseconds(900));
  EXPECT_EQ(watch.Check(), "") << "under the limit";
  watch.End(1);
  clock.Advance(absl::Milliseconds(200));
  const std::string report = watch.Check();
  EXPECT_NE(report.find("device 0's issuer has been in one driver call for over 1000 ms"), std::string::npos) << report;
  EXPECT_NE(report.find("device 0: copy calls of op 7 (job 3) for 1100 ms; ranks' ready/done: r0=7/6 r1=6/6"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("device 1: not in a call"), std::string::npos) << report;
  EXPECT_NE(report.find("device 2: not in a call"), std::string::npos) << report;
  EXPECT_EQ(watch.Check(), "") << "the same call reported twice";
  EXPECT_EQ(watch.reports(), 1u);
  // The next call of device 0, over the limit too: a report of its own.
  watch.Begin(0, &o, "end event");
  clock.Advance(absl::Seconds(2));
  EXPECT_NE(watch.Check().find("device 0: end event of op 7"), std::string::npos);
  watch.End(0);
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(watch.Check(), "");
  EXPECT_EQ(watch.reports(), 2u);
}

}  // namespace
}  // namespace dmagather::server::engines::gpu

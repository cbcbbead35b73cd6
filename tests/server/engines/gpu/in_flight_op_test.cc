// InFlightOp and InFlightPool: an op ends exactly once, when its last share
// closes, with its first error, and only then goes back to the pool and out
// of its job's load; a share that failed at issue holds the job's
// device-written done flags until the op ends; the finisher is the job's
// and only where every rank's done flag is known; Take waits while every op
// is in flight. Lockstep: op n waits until op n - 1 is enqueued everywhere.
#include "server/engines/gpu/in_flight_op.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/clock.h"
#include "server/engines/gpu/in_flight_pool.h"
#include "server/engines/gpu/lockstep.h"
#include "tests/server/engines/gpu/objects_fixture.h"

namespace dmagather::server::engines::gpu::objtest {
namespace {

using InFlightOpTest = ObjectsTest;

TEST_F(InFlightOpTest, TheLastCloseEndsTheOpOnceWithItsFirstError) {
  JobLoads loads;
  InFlightPool pool(2, common::RealClock());
  TestOp op(&log_, 0);
  InFlightOp* t = pool.Take();
  EXPECT_EQ(pool.free(), 1u);
  JobLoads::Load* load = loads.Begin(7, /*waits_ahead=*/false);
  t->Begin(&op, load, false, absl::OkStatus(), 2);
  t->OpenShares(2, 1);  // Two devices; the router's own share is open too.
  pool.Close(t, absl::InternalError("first"));
  pool.Close(t, absl::OkStatus());
  EXPECT_EQ(op.calls, 0) << "one share still open";
  EXPECT_EQ(load->in_flight.load(), 1);
  pool.Close(t, absl::DataLossError("second"));
  ASSERT_EQ(op.calls, 1);
  const absl::Status st = Ended(op);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_EQ(st.message(), "first");
  EXPECT_EQ(pool.free(), 2u) << "back in the pool";
  EXPECT_EQ(load->in_flight.load(), 0) << "out of its job's load";
  // Reused: a fresh status.
  TestOp next(&log_, 0);
  InFlightOp* u = pool.Take();
  u->Begin(&next, loads.Begin(7, false), false, absl::OkStatus(), 2);
  pool.Close(u, absl::OkStatus());
  EXPECT_TRUE(Ended(next).ok());
}

TEST_F(InFlightOpTest, AShareFailedAtIssueHoldsTheJobsDoneFlagsUntilTheOpEnds) {
  JobLoads loads;
  InFlightPool pool(4, common::RealClock());
  TestOp op(&log_, 0);
  InFlightOp* t = pool.Take();
  JobLoads::Load* load = loads.Begin(3, true);
  t->Begin(&op, load, /*waits_ahead=*/true, absl::OkStatus(), 1);
  t->OpenShares(1, 1);
  EXPECT_EQ(t->unenqueued(), 1);
  t->ShareFailed(absl::UnavailableError("copy refused"));
  t->ShareFailed(absl::UnavailableError("again"));
  EXPECT_TRUE(t->failed());
  EXPECT_EQ(load->unsettled_errors.load(), 1) << "the job is told once";
  EXPECT_TRUE(JobLoads::Unsettled(load));
  EXPECT_TRUE(t->ShareEnqueued()) << "its only share";
  EXPECT_EQ(t->unenqueued(), 0);
  pool.Close(t, absl::OkStatus());  // The device's share.
  pool.Close(t, absl::OkStatus());  // The router's.
  EXPECT_EQ(Ended(op).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(JobLoads::Unsettled(load));
  EXPECT_EQ(load->waits_ahead.load(), 0);
}

TEST_F(InFlightOpTest, TheFinisherIsTheJobsAndNeedsEveryDoneFlag) {
  FakeRuntime::Options fo;
  fo.devices = 3;
  Start(fo);
  AddRank(1, 64, 2);
  AddRank(2, 64, 2);
  JobLoads loads;
  InFlightPool pool(4, common::RealClock());
  TestOp op(&log_, 0);
  Plan(&op, 1);
  op.gpu_done = true;
  InFlightOp* t = pool.Take();
  t->Begin(&op, loads.Begin(5, false), false, absl::OkStatus(), 3);
  EXPECT_EQ(t->ChooseFinisher({0, 1, 1}, /*device_writes=*/false, loads), -1) << "the runtime cannot write";
  EXPECT_EQ(t->ChooseFinisher({0, 1, 1}, true, loads), 1) << "the lowest issuing device";
  EXPECT_EQ(t->finisher(), 1);
  pool.Close(t, absl::OkStatus());
  ASSERT_TRUE(Ended(op).ok());
  // The job's finisher stays device 1: an op issued only on device 2 gets none.
  TestOp op2(&log_, 0);
  Plan(&op2, 2);
  op2.gpu_done = true;
  InFlightOp* u = pool.Take();
  u->Begin(&op2, loads.Begin(5, false), false, absl::OkStatus(), 3);
  EXPECT_EQ(u->ChooseFinisher({0, 0, 1}, true, loads), -1);
  op2.gpu_done = false;
  EXPECT_EQ(u->ChooseFinisher({0, 1, 1}, true, loads), -1) << "the op did not ask for it";
  pool.Close(u, absl::OkStatus());
  ASSERT_TRUE(Ended(op2).ok());
}

TEST_F(InFlightOpTest, TakeWaitsWhileEveryOpIsInFlight) {
  JobLoads loads;
  InFlightPool pool(1, common::RealClock());
  TestOp a(&log_, 0), b(&log_, 0);
  InFlightOp* t = pool.Take();
  t->Begin(&a, loads.Begin(1, false), false, absl::OkStatus(), 1);
  std::atomic<bool> took{false};
  std::thread taker([&] {
    InFlightOp* u = pool.Take();
    took = true;
    u->Begin(&b, loads.Begin(1, false), false, absl::OkStatus(), 1);
    pool.Close(u, absl::OkStatus());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(took.load()) << "the pool is empty";
  pool.Close(t, absl::OkStatus());
  taker.join();
  EXPECT_TRUE(took.load());
  EXPECT_TRUE(Ended(a).ok());
  EXPECT_TRUE(Ended(b).ok());
}

TEST(LockstepTest, AnOpWaitsUntilTheOneBeforeIsEnqueuedEverywhere) {
  std::atomic<bool> abandon{false};
  Lockstep lockstep(common::RealClock(), abandon);
  EXPECT_EQ(lockstep.Next(), 1u);
  EXPECT_EQ(lockstep.Next(), 2u);
  EXPECT_EQ(lockstep.Next(), 3u);
  lockstep.WaitForEarlier(1);  // The first waits for nothing.
  std::atomic<bool> third_went{false};
  std::thread third([&] {
    lockstep.WaitForEarlier(3);
    third_went = true;
  });
  lockstep.Enqueued(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(third_went.load()) << "op 2 is not enqueued yet";
  lockstep.Enqueued(2);
  third.join();
  EXPECT_TRUE(third_went.load());
  EXPECT_EQ(lockstep.enqueued_through(), 2u);
  // Abandoned: no wait.
  abandon = true;
  lockstep.WaitForEarlier(10);
}

}  // namespace
}  // namespace dmagather::server::engines::gpu::objtest

// Registry, the service edge: gRPC requests converted for the core (and
// refused before it where the request alone says so), a reap pass that
// keeps an ended job's telemetry and frees its sessions, and the telemetry
// protos as each viewer may see them.
#include "server/service/registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_copy_engine.h"
#include "tests/server/service/handovers.h"

namespace dmagather::server::service {
namespace {

constexpr uid_t kUid = 3100;
constexpr pid_t kPid = 31;

class RegistryTest : public ::testing::Test {
 protected:
  RegistryTest()
      : tickets_(TicketOptions(&clock_)), handovers_(&tickets_), registry_(&engine_, &tickets_, Limits{0, 0, 0, 0}) {}

  static TicketTable::Options TicketOptions(common::Clock* clock) {
    TicketTable::Options o;
    o.clock = clock;  // Tickets never expire under the test.
    return o;
  }

  v1::JoinRequest JoinReq(const std::string& job, int world, int rank) {
    v1::JoinRequest req;
    req.set_job_key(job);
    req.set_world_size(world);
    req.set_rank(rank);
    req.set_segment_token(500 + rank);
    req.set_segment_ticket(handovers_.Segment(500 + rank, kUid, kPid));
    return req;
  }

  absl::StatusOr<Joined> JoinRank(const std::string& job, int world, int rank) {
    return registry_.Join(JoinReq(job, world, rank), PeerCred{kUid, 0, kPid});
  }

  common::testing::FakeClock clock_;
  TicketTable tickets_;
  Handovers handovers_;
  engines::testing::FakeCopyEngine engine_;
  Registry registry_;
};

TEST(RegistryEdgeTest, JoinRequestsBecomePlainSpecs) {
  v1::JoinRequest req;
  req.set_job_key("k");
  req.set_world_size(4);
  req.set_rank(3);
  req.set_segment_token(0xfeed);
  req.set_segment_ticket("t");
  req.set_job_id("id");
  req.set_join_timeout_ms(1234);
  req.mutable_device()->set_ordinal(-1);
  JoinSpec s = JoinSpecOf(req);
  EXPECT_EQ(s.job_key, "k");
  EXPECT_EQ(s.world_size, 4);
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.segment_token, 0xfeedu);
  EXPECT_EQ(s.segment_ticket, "t");
  EXPECT_EQ(s.job_id, "id");
  EXPECT_EQ(s.join_timeout_ms, 1234);
  EXPECT_EQ(s.device.kind, "cpu") << "no device kind: a cpu rank";
  req.mutable_device()->set_kind("cuda");
  req.mutable_device()->set_ordinal(2);
  req.mutable_device()->set_uuid(std::string(16, 'u'));
  req.mutable_device()->set_pci_bus_id("0000:19:00.0");
  s = JoinSpecOf(req);
  EXPECT_EQ(s.device.kind, "cuda");
  EXPECT_EQ(s.device.ordinal, 2);
  EXPECT_EQ(s.device.uuid, std::string(16, 'u'));
  EXPECT_EQ(s.device.pci_bus_id, "0000:19:00.0");

  v1::RegisterRequest reg;
  reg.set_session_id(9);
  reg.set_session_secret("s");
  reg.set_memory_kind("cuda_vmm");
  reg.set_bytes(1 << 21);
  reg.set_handle("h");
  reg.add_tickets("a");
  reg.add_tickets("b");
  RegisterSpec r = RegisterSpecOf(reg);
  EXPECT_EQ(r.session_id, 9u);
  EXPECT_EQ(r.session_secret, "s");
  EXPECT_EQ(r.memory_kind, "cuda_vmm");
  EXPECT_EQ(r.bytes, uint64_t{1} << 21);
  EXPECT_EQ(r.handle, "h");
  EXPECT_TRUE(r.ticket.empty());
  EXPECT_EQ(r.tickets, (std::vector<std::string>{"a", "b"}));
}

TEST_F(RegistryTest, RequestsTheDaemonCannotServeAreFallbacksThatCountNothing) {
  v1::JoinRequest req = JoinReq("job", 1, 0);
  req.set_backend("cuda");
  auto j = registry_.Join(req, PeerCred{kUid, 0, kPid});
  EXPECT_TRUE(common::IsFallback(j.status())) << j.status();
  EXPECT_NE(j.status().message().find("runs 'fake'"), std::string::npos) << j.status();
  req.set_backend("");
  req.set_abi_version(3);
  j = registry_.Join(req, PeerCred{kUid, 0, kPid});
  EXPECT_TRUE(common::IsFallback(j.status())) << j.status();
  EXPECT_EQ(registry_.num_sessions(), 0);
  EXPECT_EQ(registry_.num_jobs(), 0);
  EXPECT_EQ(tickets_.size(), 1u) << "refused before the segment ticket is claimed";
  req.set_abi_version(2);
  EXPECT_TRUE(registry_.Join(req, PeerCred{kUid, 0, kPid}).ok());
}

TEST_F(RegistryTest, AMultiNodeJoinWithoutPeersIsRefused) {
  v1::JoinRequest req = JoinReq("job", 2, 0);
  req.set_job_id("some-id");
  auto j = registry_.Join(req, PeerCred{kUid, 0, kPid});
  EXPECT_EQ(j.status().code(), absl::StatusCode::kFailedPrecondition) << j.status();
  EXPECT_NE(j.status().message().find("--peer_listen"), std::string::npos) << j.status();
}

TEST_F(RegistryTest, AnUnknownSessionIsNamedBeforeAMalformedRegister) {
  v1::RegisterRequest reg;  // No memory kind, no ticket: malformed.
  reg.set_session_id(12345);
  auto r = registry_.Register(reg);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  auto j = JoinRank("job", 1, 0);
  ASSERT_TRUE(j.ok()) << j.status();
  reg.set_session_id(j->session->id());
  reg.set_session_secret(j->session->secret());
  r = registry_.Register(reg);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  reg.set_memory_kind(engines::kMemoryHostMemfd);
  reg.set_bytes(4096);
  reg.set_ticket(handovers_.Buffer(4096, kUid, kPid));
  r = registry_.Register(reg);
  ASSERT_TRUE(r.ok()) << r.status();
  v1::StatsReply stats;
  registry_.FillStats("", &stats);
  EXPECT_EQ(stats.held_regions(), 1);
  EXPECT_EQ(stats.held_bytes(), 4096u);
  ASSERT_EQ(stats.jobs_size(), 1);
  EXPECT_EQ(stats.jobs(0).registered_bytes(), 4096u);
  EXPECT_EQ(stats.jobs(0).ranks(0).regions(), 1u);
}

TEST_F(RegistryTest, AReapPassKeepsTheEndedJobsTelemetryAndFreesItsSessions) {
  auto r0 = JoinRank("job", 2, 0);
  auto r1 = JoinRank("job", 2, 1);
  ASSERT_TRUE(r0.ok() && r1.ok());
  r0->job->counters.ops.store(7);
  r0->job->counters.bytes.store(7000);
  v1::StatsReply live;
  registry_.FillStats("job", &live);
  ASSERT_EQ(live.jobs_size(), 1);
  EXPECT_EQ(live.jobs(0).state(), "running");
  EXPECT_EQ(live.jobs(0).ranks_size(), 2);
  EXPECT_EQ(live.jobs(0).ranks(1).pid(), kPid);
  EXPECT_EQ(live.total_ops(), 7u);

  ASSERT_TRUE(registry_.Leave(r0->session->id(), r0->session->secret()).ok());
  registry_.EndSession(*r0);
  registry_.EndSession(*r1);
  registry_.Reap();  // No ingress thread: the frees are due at once.
  EXPECT_EQ(registry_.num_jobs(), 0);
  EXPECT_TRUE(r0->session->memory_released());
  EXPECT_TRUE(r1->session->memory_released());

  v1::StatsReply after;
  registry_.FillStats("", &after);
  EXPECT_EQ(after.jobs_completed(), 1u);
  EXPECT_EQ(after.total_ops(), 7u) << "node totals never go backwards";
  EXPECT_EQ(after.total_bytes(), 7000u);
  ASSERT_EQ(after.jobs_size(), 1);
  EXPECT_EQ(after.jobs(0).job_key(), "job");
  EXPECT_EQ(after.jobs(0).state(), "ended") << "a rank left: aborted, not failed";
  EXPECT_EQ(after.jobs(0).uid(), kUid);

  Viewer stranger;
  stranger.known = true;
  stranger.uid = kUid + 1;
  v1::StatsReply theirs;
  registry_.FillStats("", stranger, &theirs);
  EXPECT_EQ(theirs.jobs_size(), 0) << "another uid's jobs stay hidden";
  EXPECT_EQ(theirs.total_ops(), 7u) << "node totals are for everyone";
  Viewer owner = stranger;
  owner.uid = kUid;
  v1::StatsReply mine;
  registry_.FillStats("", owner, &mine);
  EXPECT_EQ(mine.jobs_size(), 1);
  EXPECT_EQ(mine.jobs(0).ops(), 7u);
}

TEST_F(RegistryTest, AFailedJobIsKeptAsFailed) {
  auto r0 = JoinRank("job", 1, 0);
  ASSERT_TRUE(r0.ok());
  r0->job->Fail(absl::DataLossError("engine failed"), 0);
  registry_.EndSession(*r0);
  registry_.Reap();
  v1::StatsReply stats;
  registry_.FillStats("job", &stats);
  ASSERT_EQ(stats.jobs_size(), 1);
  EXPECT_EQ(stats.jobs(0).state(), "failed");
}

TEST_F(RegistryTest, OnlyTheLastSixteenEndedJobsAreKept) {
  for (int i = 0; i < 20; ++i) {
    auto j = JoinRank("job" + std::to_string(i), 1, 0);
    ASSERT_TRUE(j.ok()) << j.status();
    registry_.EndSession(*j);
    registry_.Reap();
  }
  v1::StatsReply stats;
  registry_.FillStats("", &stats);
  EXPECT_EQ(stats.jobs_completed(), 20u);
  ASSERT_EQ(stats.jobs_size(), 16);
  EXPECT_EQ(stats.jobs(0).job_key(), "job19") << "newest first";
  EXPECT_EQ(stats.jobs(15).job_key(), "job4");
}

// Polls `done` (the reaper thread works on its own cadence); false if it
// never came true in a minute.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 60000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return done();
}

TEST_F(RegistryTest, TheReaperThreadFreesOnlyAfterAWholeIngressPass) {
  std::atomic<uint64_t> epoch{10};
  std::atomic<int> kicks{0};
  registry_.StartReaper([&] { return epoch.load(); }, [&] { kicks.fetch_add(1); });
  auto j = JoinRank("job", 1, 0);
  ASSERT_TRUE(j.ok()) << j.status();
  registry_.EndSession(*j);
  ASSERT_TRUE(Eventually([&] { return registry_.num_jobs() == 0; })) << "the job was never swept";
  ASSERT_TRUE(Eventually([&] { return kicks.load() > 0; })) << "frees wait: the ingress thread is asked for a pass";
  EXPECT_FALSE(j->session->memory_released()) << "the ingress epoch has not moved";
  epoch.store(12);
  EXPECT_TRUE(Eventually([&] { return j->session->memory_released(); }));
  registry_.StopReaper();
  v1::StatsReply stats;
  registry_.FillStats("", &stats);
  EXPECT_EQ(stats.jobs_completed(), 1u);
}

}  // namespace
}  // namespace dmagather::server::service

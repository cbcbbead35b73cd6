// RegistryCore with the fake engine and real hand-overs (memfds through the
// ticket table): sessions and jobs from Join to the sweep, the per-uid
// quotas given back on every path (errors included), registration and its
// charges, and what the sweep retires for the reaper.
#include "server/service/registry_core.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "abi/descriptor_v2.h"
#include "abi/graph_v1.h"
#include "abi/ring_v1.h"
#include "common/clock.h"
#include "common/memfd.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_copy_engine.h"
#include "tests/server/service/handovers.h"

namespace dmagather::server::service {
namespace {

using scheduler::Rank;

constexpr uid_t kUid = 4242;
constexpr pid_t kPid = 777;

// The fake engine, with imports that fail when told.
class Engine : public engines::testing::FakeCopyEngine {
 public:
  absl::StatusOr<std::shared_ptr<engines::ImportedRegion>> Import(const engines::RegionSpec& spec) override {
    ++imports;
    if (fail_imports) return absl::InternalError("import failed (test)");
    return FakeCopyEngine::Import(spec);
  }
  bool fail_imports = false;
  int imports = 0;
};

class FakePeers : public PeerJoiner {
 public:
  absl::Status CheckJobId(const std::string& job_id) override {
    return job_id == "bad" ? absl::InvalidArgumentError("bad job id") : absl::OkStatus();
  }
  absl::Status AddRank(const std::shared_ptr<scheduler::Job>&, const std::string& job_id, int timeout_ms) override {
    added.push_back(job_id);
    last_timeout_ms = timeout_ms;
    return add_rank;
  }
  absl::Status add_rank = absl::OkStatus();
  std::vector<std::string> added;
  int last_timeout_ms = 0;
};

class RegistryCoreTest : public ::testing::Test {
 protected:
  RegistryCoreTest() : tickets_(TicketOptions(&clock_)), handovers_(&tickets_) {}

  static TicketTable::Options TicketOptions(common::Clock* clock) {
    TicketTable::Options o;
    o.clock = clock;
    return o;
  }

  std::string HandOverSegment(uint64_t token, pid_t pid = kPid, uid_t uid = kUid) {
    return handovers_.Segment(token, uid, pid);
  }
  std::string HandOverBuffer(uint64_t bytes, pid_t pid = kPid, int fd = -1) {
    return handovers_.Buffer(bytes, kUid, pid, fd);
  }

  JoinSpec Spec(const std::string& job, int world, int rank, uint64_t token) {
    JoinSpec s;
    s.job_key = job;
    s.world_size = world;
    s.rank = rank;
    s.segment_token = token;
    s.segment_ticket = HandOverSegment(token);
    return s;
  }

  absl::StatusOr<Joined> JoinRank(RegistryCore& core, const std::string& job, int world, int rank) {
    return core.Join(Spec(job, world, rank, 1000 + rank), PeerCred{kUid, 0, kPid});
  }
  // A rank coming back from an earlier daemon (Join with resume).
  absl::StatusOr<Joined> JoinBack(RegistryCore& core, const std::string& job, int world, int rank) {
    JoinSpec s = Spec(job, world, rank, 1000 + rank);
    s.resume = true;
    return core.Join(s, PeerCred{kUid, 0, kPid});
  }

  RegisterSpec HostRegion(const Joined& j, uint64_t bytes, const std::string& ticket) {
    RegisterSpec r;
    r.session_id = j.session->id();
    r.session_secret = j.session->secret();
    r.memory_kind = engines::kMemoryHostMemfd;
    r.bytes = bytes;
    r.ticket = ticket;
    return r;
  }

  static Limits NoLimits() { return Limits{0, 0, 0, 0}; }

  common::testing::FakeClock clock_;
  TicketTable tickets_;
  Engine engine_;
  Handovers handovers_;
};

TEST_F(RegistryCoreTest, JoinCreatesTheJobAndFeedsIngressOnceAllRanksAreIn) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  const uint64_t v0 = core.version();
  auto r0 = JoinRank(core, "job", 2, 0);
  ASSERT_TRUE(r0.ok()) << r0.status();
  EXPECT_EQ(core.num_jobs(), 1);
  EXPECT_EQ(core.num_sessions(), 1);
  EXPECT_EQ(r0->session->uid(), kUid) << "the hand-over's uid, the kernel's";
  EXPECT_EQ(r0->session->pid(), kPid);
  EXPECT_FALSE(r0->job->all_joined());
  EXPECT_TRUE(core.Snapshot().empty()) << "a job joins the ingress feed once complete";
  EXPECT_EQ(core.quota().held(kUid).jobs, 1);
  EXPECT_EQ(core.quota().held(kUid).sessions, 1);

  auto r1 = JoinRank(core, "job", 2, 1);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->job, r0->job) << "the same job key and uid: the same job";
  EXPECT_TRUE(r1->job->all_joined());
  EXPECT_GT(core.version(), v0);
  const std::vector<ingress::JobFeed> feed = core.Snapshot();
  ASSERT_EQ(feed.size(), 1u);
  EXPECT_EQ(feed[0].job, r0->job);
  ASSERT_EQ(feed[0].inputs.size(), 2u);
  EXPECT_EQ(feed[0].inputs[0], r0->session->input());
  EXPECT_EQ(feed[0].inputs[1], r1->session->input());
  EXPECT_EQ(core.quota().held(kUid).jobs, 1);
  EXPECT_EQ(core.quota().held(kUid).sessions, 2);
  EXPECT_EQ(tickets_.size(), 0u) << "both segment tickets spent";
}

TEST_F(RegistryCoreTest, AnotherUidHasItsOwnJobOfTheSameKey) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  ASSERT_TRUE(JoinRank(core, "job", 2, 0).ok());
  JoinSpec other;
  other.job_key = "job";
  other.world_size = 3;  // Would clash with the first uid's job.
  other.rank = 0;
  other.segment_token = 9;
  other.segment_ticket = HandOverSegment(9, /*pid=*/888, /*uid=*/5000);
  auto j = core.Join(other, PeerCred{5000, 0, 888});
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->job->uid(), 5000u);
  EXPECT_EQ(j->job->world_size(), 3);
  EXPECT_EQ(core.num_jobs(), 2);
}

TEST_F(RegistryCoreTest, TheSessionCountGoesBackWhenTheSegmentIsRefused) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  JoinSpec s = Spec("job", 2, 0, 1000);
  s.segment_token = 1;  // Not the segment's.
  auto j = core.Join(s, PeerCred{kUid, 0, kPid});
  EXPECT_EQ(j.status().code(), absl::StatusCode::kPermissionDenied) << j.status();
  EXPECT_EQ(core.quota().held(kUid).sessions, 0);
  EXPECT_EQ(core.quota().uids(), 0) << "nothing of the uid is left counted";
  EXPECT_EQ(core.num_sessions(), 0);
  EXPECT_EQ(core.num_jobs(), 0) << "the job is created only for a mapped segment";
}

TEST_F(RegistryCoreTest, ATicketOfAnotherProcessIsSpentAndCountsNothing) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto j = core.Join(Spec("job", 2, 0, 1000), PeerCred{kUid, 0, kPid + 1});
  EXPECT_EQ(j.status().code(), absl::StatusCode::kPermissionDenied) << j.status();
  EXPECT_NE(j.status().message().find("pid 777"), std::string::npos) << j.status();
  EXPECT_EQ(tickets_.size(), 0u) << "the leaked ticket is spent";
  EXPECT_EQ(core.quota().uids(), 0);
}

TEST_F(RegistryCoreTest, TheSessionLimitRefusesThenFreesAtEndSession) {
  Limits limits = NoLimits();
  limits.max_sessions_per_uid = 1;
  RegistryCore core(&engine_, &tickets_, limits);
  auto r0 = JoinRank(core, "job", 2, 0);
  ASSERT_TRUE(r0.ok()) << r0.status();
  auto r1 = JoinRank(core, "job", 2, 1);
  EXPECT_EQ(r1.status().code(), absl::StatusCode::kResourceExhausted) << r1.status();
  EXPECT_NE(r1.status().message().find("--max_sessions_per_uid"), std::string::npos) << r1.status();
  EXPECT_EQ(r0->job->joined(), 1) << "the refused rank never reached the job";
  core.EndSession(*r0);
  EXPECT_EQ(core.quota().held(kUid).sessions, 0);
  auto again = JoinRank(core, "job2", 1, 0);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST_F(RegistryCoreTest, TheJobLimitGivesTheSessionCountBack) {
  Limits limits = NoLimits();
  limits.max_jobs_per_uid = 1;
  RegistryCore core(&engine_, &tickets_, limits);
  ASSERT_TRUE(JoinRank(core, "a", 2, 0).ok());
  auto b = JoinRank(core, "b", 2, 0);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  EXPECT_NE(b.status().message().find("job 'b' was not created"), std::string::npos) << b.status();
  EXPECT_EQ(core.num_jobs(), 1);
  EXPECT_EQ(core.quota().held(kUid).jobs, 1);
  EXPECT_EQ(core.quota().held(kUid).sessions, 1) << "b's session count went back";
}

TEST_F(RegistryCoreTest, AMismatchedRankGivesItsSessionCountBack) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto r0 = JoinRank(core, "job", 2, 0);
  ASSERT_TRUE(r0.ok());
  auto wrong_size = JoinRank(core, "job", 3, 1);
  EXPECT_EQ(wrong_size.status().code(), absl::StatusCode::kInvalidArgument) << wrong_size.status();
  EXPECT_NE(wrong_size.status().message().find("has world size 2"), std::string::npos);
  auto same_rank = JoinRank(core, "job", 2, 0);
  EXPECT_FALSE(same_rank.ok()) << "rank 0 is taken";
  EXPECT_EQ(core.quota().held(kUid).sessions, 1);
  EXPECT_EQ(core.num_sessions(), 1);
  EXPECT_EQ(r0->job->joined(), 1);
}

TEST_F(RegistryCoreTest, MultiNodeJoinsGoThroughThePeersAndFailuresLeaveNothing) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  JoinSpec s = Spec("mn", 2, 0, 1000);
  s.job_id = "id-1";
  auto refused = core.Join(s, PeerCred{kUid, 0, kPid});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_EQ(tickets_.size(), 1u) << "refused before the ticket is claimed";

  FakePeers peers;
  core.SetPeerJoiner(&peers);
  s.job_id = "bad";
  EXPECT_EQ(core.Join(s, PeerCred{kUid, 0, kPid}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tickets_.size(), 1u);

  s.job_id = "id-1";
  s.join_timeout_ms = 0;
  peers.add_rank = absl::UnavailableError("coordinator unreachable");
  auto failed = core.Join(s, PeerCred{kUid, 0, kPid});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_EQ(peers.added, std::vector<std::string>{"id-1"});
  EXPECT_EQ(peers.last_timeout_ms, 60000) << "no timeout given: the default";
  EXPECT_EQ(core.quota().held(kUid).sessions, 0);
  EXPECT_EQ(core.num_sessions(), 0);
  ASSERT_EQ(core.num_jobs(), 1) << "the job entry stays until the sweep";
  DeferredFrees frees;
  EXPECT_TRUE(core.Sweep(0, &frees).empty()) << "it never ran: no telemetry entry";
  EXPECT_EQ(core.num_jobs(), 0) << "no rank left in it";
  EXPECT_EQ(core.quota().uids(), 0) << "the job count went back with the entry";
  EXPECT_EQ(core.view().retired.jobs_completed, 0u);

  peers.add_rank = absl::OkStatus();
  JoinSpec again = Spec("mn", 2, 0, 1000);
  again.job_id = "id-1";
  again.join_timeout_ms = 1500;
  auto ok = core.Join(again, PeerCred{kUid, 0, kPid});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->job->multi_node());
  EXPECT_EQ(peers.last_timeout_ms, 1500);
  auto mixed = core.Join(Spec("mn", 2, 1, 1001), PeerCred{kUid, 0, kPid});
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument) << mixed.status();
  EXPECT_NE(mixed.status().message().find("gave no job id"), std::string::npos) << mixed.status();
  EXPECT_EQ(core.quota().held(kUid).sessions, 1);
}

TEST_F(RegistryCoreTest, ASessionEndedBeforeTheJobRanLeavesAJobTheSweepDrops) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto r0 = JoinRank(core, "job", 2, 0);
  ASSERT_TRUE(r0.ok());
  core.EndSession(*r0);
  EXPECT_EQ(r0->session->rank()->state(), Rank::State::kLeft);
  EXPECT_TRUE(r0->session->ended.load());
  EXPECT_EQ(r0->job->joined(), 0);
  EXPECT_EQ(core.num_sessions(), 0);
  EXPECT_EQ(core.quota().held(kUid).sessions, 0);
  EXPECT_EQ(core.quota().held(kUid).jobs, 1);
  DeferredFrees frees;
  EXPECT_TRUE(core.Sweep(0, &frees).empty());
  EXPECT_EQ(core.num_jobs(), 0);
  EXPECT_EQ(core.quota().uids(), 0);
  EXPECT_TRUE(frees.empty()) << "the session left the job before it ran; its Session frees itself";
}

TEST_F(RegistryCoreTest, AJobThatRanIsSweptOnceEveryRankIsGoneAndItsSessionsAreRetired) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto r0 = JoinRank(core, "job", 2, 0);
  auto r1 = JoinRank(core, "job", 2, 1);
  ASSERT_TRUE(r0.ok() && r1.ok());
  r0->job->counters.ops.store(5);
  r0->job->counters.bytes.store(640);
  DeferredFrees frees;
  EXPECT_TRUE(core.Sweep(1, &frees).empty()) << "both ranks live";

  ASSERT_TRUE(core.Leave(r0->session->id(), r0->session->secret()).ok());
  EXPECT_EQ(r0->session->rank()->state(), Rank::State::kLeft);
  core.EndSession(*r0);  // A clean leave fails the job's later ops.
  EXPECT_TRUE(r0->job->failed());
  EXPECT_TRUE(absl::IsAborted(r0->job->failure()));
  EXPECT_TRUE(core.Sweep(2, &frees).empty()) << "rank 1's stream is open";
  EXPECT_EQ(frees.size(), 1u) << "rank 0's session is retired already";

  core.EndSession(*r1);  // The stream ended without Leave: the rank died.
  EXPECT_EQ(r1->session->rank()->state(), Rank::State::kGone);
  EXPECT_EQ(core.num_sessions(), 0);
  EXPECT_EQ(core.quota().held(kUid).sessions, 0);
  std::vector<JobView> ended = core.Sweep(3, &frees);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].job, r0->job);
  ASSERT_EQ(ended[0].sessions.size(), 2u);
  EXPECT_EQ(ended[0].sessions[1], r1->session);
  EXPECT_EQ(core.num_jobs(), 0);
  EXPECT_EQ(core.quota().uids(), 0);
  const RetiredTotals t = core.view().retired;
  EXPECT_EQ(t.jobs_completed, 1u);
  EXPECT_EQ(t.ops, 5u);
  EXPECT_EQ(t.bytes, 640u);
  EXPECT_EQ(frees.size(), 2u) << "each session once";
  EXPECT_TRUE(frees.TakeDue(3, /*gated=*/true).empty()) << "no ingress pass since";
  auto due = frees.TakeDue(4, /*gated=*/true);
  ASSERT_EQ(due.size(), 1u) << "rank 0's, retired at epoch 2";
  EXPECT_EQ(due[0].get(), static_cast<Retirable*>(r0->session.get()));
  due = frees.TakeDue(5, /*gated=*/true);
  ASSERT_EQ(due.size(), 1u);
  due[0]->ReleaseMemory();
  EXPECT_TRUE(r1->session->memory_released());
  EXPECT_EQ(r1->session->rank()->completion(), nullptr) << "the engine let go of the completion block";
}

TEST_F(RegistryCoreTest, AGoneRanksSessionWaitsForItsOpsInFlight) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto r0 = JoinRank(core, "job", 2, 0);
  auto r1 = JoinRank(core, "job", 2, 1);
  ASSERT_TRUE(r0.ok() && r1.ok());
  r0->session->rank()->inflight.store(1);
  core.EndSession(*r0);
  DeferredFrees frees;
  EXPECT_TRUE(core.Sweep(0, &frees).empty()) << "rank 1 is live";
  EXPECT_TRUE(frees.empty()) << "an op may still write rank 0's completion block";
  r0->session->rank()->inflight.store(0);
  EXPECT_TRUE(core.Sweep(0, &frees).empty());
  EXPECT_EQ(frees.size(), 1u);
  EXPECT_EQ(core.num_jobs(), 1);
}

TEST_F(RegistryCoreTest, RegisterChargesOnceAndGivesTheChargeBackOnEveryPath) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto j = JoinRank(core, "job", 1, 0);
  ASSERT_TRUE(j.ok());
  auto m = common::MemfdMapping::Create("buf", 4096);
  ASSERT_TRUE(m.ok());
  auto id = core.Register(HostRegion(*j, 4096, HandOverBuffer(4096, kPid, m->fd())));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(core.ledger().held(kUid).regions, 1);
  EXPECT_EQ(core.ledger().held(kUid).bytes, 4096u);
  auto again = core.Register(HostRegion(*j, 4096, HandOverBuffer(4096, kPid, m->fd())));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *id) << "the same memfd and range: the region already there";
  EXPECT_EQ(engine_.imports, 1);
  EXPECT_EQ(core.ledger().held(kUid).regions, 1);

  engine_.fail_imports = true;
  auto failed = core.Register(HostRegion(*j, 8192, HandOverBuffer(8192)));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  EXPECT_EQ(core.ledger().held(kUid).regions, 1) << "the failed import's charge went back";
  EXPECT_EQ(core.ledger().held(kUid).bytes, 4096u);
  engine_.fail_imports = false;

  ASSERT_TRUE(core.Deregister(j->session->id(), j->session->secret(), *id).ok());
  EXPECT_EQ(core.ledger().held(kUid).regions, 0);
  EXPECT_EQ(core.ledger().total().bytes, 0u);
  EXPECT_FALSE(core.Deregister(j->session->id(), j->session->secret(), *id).ok()) << "already gone";
}

TEST_F(RegistryCoreTest, RegisterRefusesWhatTheSessionsProcessDidNotHandOver) {
  Limits limits = NoLimits();
  limits.max_regions_per_uid = 1;
  RegistryCore core(&engine_, &tickets_, limits);
  auto j = JoinRank(core, "job", 1, 0);
  ASSERT_TRUE(j.ok());
  auto foreign = core.Register(HostRegion(*j, 4096, HandOverBuffer(4096, kPid + 1)));
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kPermissionDenied) << foreign.status();
  auto short_buf = core.Register(HostRegion(*j, 8192, HandOverBuffer(4096)));
  EXPECT_EQ(short_buf.status().code(), absl::StatusCode::kInvalidArgument) << short_buf.status();
  // Its own segment can never be a buffer.
  auto seg = core.Register(HostRegion(*j, abi::SegmentLayoutV1::kBytes,
                                      HandOverBuffer(abi::SegmentLayoutV1::kBytes, kPid, handovers_.segments[0].fd())));
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kInvalidArgument) << seg.status();
  EXPECT_NE(seg.status().message().find("own rank segment"), std::string::npos) << seg.status();
  EXPECT_EQ(engine_.imports, 0);
  EXPECT_EQ(core.ledger().held(kUid).regions, 0);

  ASSERT_TRUE(core.Register(HostRegion(*j, 4096, HandOverBuffer(4096))).ok());
  auto over = core.Register(HostRegion(*j, 4096, HandOverBuffer(4096)));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_EQ(engine_.imports, 1) << "refused before the engine maps anything";
}

TEST_F(RegistryCoreTest, TheDoorbellIsNeverABuffer) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto bell = common::MemfdMapping::Create("bell", 4096);
  ASSERT_TRUE(bell.ok());
  struct stat st;
  ASSERT_EQ(fstat(bell->fd(), &st), 0);
  core.SetDoorbellIdentity(st.st_dev, st.st_ino);
  auto j = JoinRank(core, "job", 1, 0);
  ASSERT_TRUE(j.ok());
  auto r = core.Register(HostRegion(*j, 4096, HandOverBuffer(4096, kPid, bell->fd())));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("doorbell"), std::string::npos) << r.status();
}

TEST_F(RegistryCoreTest, OnlyTheSecretsHolderActsOnASession) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto j = JoinRank(core, "job", 1, 0);
  ASSERT_TRUE(j.ok());
  const uint64_t id = j->session->id();
  EXPECT_EQ(core.Leave(id, "wrong").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core.CheckSession(id, "wrong").code(), absl::StatusCode::kNotFound);
  RegisterSpec r = HostRegion(*j, 4096, HandOverBuffer(4096));
  r.session_secret = "wrong";
  EXPECT_EQ(core.Register(r).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(j->session->rank()->state(), Rank::State::kActive);
  EXPECT_TRUE(core.CheckSession(id, j->session->secret()).ok());
  core.EndSession(*j);
  EXPECT_EQ(core.CheckSession(id, j->session->secret()).code(), absl::StatusCode::kNotFound)
      << "an ended session is no session";
  r.session_secret = j->session->secret();
  EXPECT_EQ(core.Register(r).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RegistryCoreTest, AFrozenRegistryRefusesJoinsAndLeavesTheRanksOpsAlone) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto a = JoinRank(core, "job", 2, 0);
  auto b = JoinRank(core, "job", 2, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  abi::StoreRelease(&a->session->rank()->completion()->ready_seq, 7u);
  core.FreezeForHandover();
  EXPECT_TRUE(core.stopping());
  auto late = JoinRank(core, "other", 1, 0);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  // A session's end (the stream closed as the daemon stops) fails nothing:
  // no error record, no done or ready flag moved, the job not failed.
  core.EndSession(*a);
  EXPECT_FALSE(a->job->failed());
  const abi::CompletionV1* c = a->session->rank()->completion();
  EXPECT_EQ(c->error_count, 0u);
  EXPECT_EQ(c->done_seq, 0u);
  EXPECT_EQ(c->ready_seq, 7u);
  EXPECT_EQ(b->session->rank()->completion()->error_count, 0u);
}

// --- Taking a job back from an earlier daemon (Join with resume, Resume) ---

// A captured op's definition as the rank published it: one item, `count`
// bytes from offset 0 of region `id`, gathered at offset 4096 of it.
CapturedDefinition Captured(uint32_t seq, uint32_t slot, uint32_t id, uint64_t count) {
  abi::DescriptorV2 d{};
  d.stamp = abi::kDescriptorStampV2;
  d.op = 1 | abi::kOpPersistentBit | (slot << abi::kOpPersistentSlotShift);  // kAllGather
  d.seq = seq;
  d.dtype = 0;  // uint8
  d.count = count;
  d.send.region_id = id;
  d.send.offset = 0;
  d.num_recv = 1;
  d.recv[0].region_id = id;
  d.recv[0].offset = 4096;
  return CapturedDefinition{seq, slot, std::string(reinterpret_cast<const char*>(&d), sizeof(d))};
}

TEST_F(RegistryCoreTest, CapturedOpsHandedBackAreArmedOnceEveryRankIsBack) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto a = JoinBack(core, "graphs", 2, 0);
  auto b = JoinBack(core, "graphs", 2, 1);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  for (const Joined* j : {&*a, &*b}) {
    RegisterSpec r = HostRegion(*j, 8192, HandOverBuffer(8192));
    r.region_id = 9;  // Its id under the earlier daemon.
    ASSERT_TRUE(core.Register(r).ok());
    abi::StoreRelease(&j->session->rank()->completion()->done_seq, 3u);
  }
  // Not a whole captured op of that slot: the Resume fails, the rank is not counted back.
  CapturedDefinition torn = Captured(3, 2, 9, 1024);
  torn.descriptors.resize(100);
  EXPECT_EQ(core.Resume(a->session->id(), a->session->secret(), 0, 0, {torn}).code(),
            absl::StatusCode::kInvalidArgument);
  CapturedDefinition wrong_slot = Captured(3, 4, 9, 1024);
  wrong_slot.slot = 2;
  EXPECT_EQ(core.Resume(a->session->id(), a->session->secret(), 0, 0, {wrong_slot}).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status unknown = core.Resume(a->session->id(), a->session->secret(), 0, 0, {Captured(3, 2, 7, 1024)});
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument) << unknown;
  EXPECT_NE(unknown.message().find("captured op #3 (graph slot 2) handed back"), std::string::npos) << unknown;
  EXPECT_EQ(core.handover().ranks_resumed.load(), 0u);
  std::vector<CapturedDefinition> too_many(abi::kGraphSlotsV1 + 1, Captured(3, 2, 9, 1024));
  EXPECT_EQ(core.Resume(a->session->id(), a->session->secret(), 0, 0, too_many).code(),
            absl::StatusCode::kInvalidArgument);
  // Rank 0 captured op 3 into its slot 2, rank 1 into its slot 5.
  ASSERT_TRUE(core.Resume(a->session->id(), a->session->secret(), 0, 0, {Captured(3, 2, 9, 1024)}).ok());
  EXPECT_FALSE(a->job->has_persistent()) << "armed only once every rank is back";
  const absl::Status back = core.Resume(b->session->id(), b->session->secret(), 0, 0, {Captured(3, 5, 9, 1024)});
  ASSERT_TRUE(back.ok()) << back;
  EXPECT_TRUE(a->job->has_persistent());
  EXPECT_EQ(a->job->persistent_ops(), 1u);
  EXPECT_EQ(core.Snapshot().size(), 1u);
}

TEST_F(RegistryCoreTest, ACapturedReduceScatterHandedBackIsArmedAgain) {
  // The daemon died with a reduce-scatter captured in both ranks' graphs:
  // its definition (an all-to-all into the capture's own staging) comes
  // back in each rank's Resume, validated as the ring's descriptors are.
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto a = JoinBack(core, "graphs", 2, 0);
  auto b = JoinBack(core, "graphs", 2, 1);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  for (const Joined* j : {&*a, &*b}) {
    RegisterSpec r = HostRegion(*j, 8192, HandOverBuffer(8192));
    r.region_id = 9;
    ASSERT_TRUE(core.Register(r).ok());
    abi::StoreRelease(&j->session->rank()->completion()->done_seq, 3u);
  }
  auto rs = [](uint32_t slot, uint64_t send_stride) {
    CapturedDefinition def = Captured(3, slot, 9, 1024);
    abi::DescriptorV2 d;
    std::memcpy(&d, def.descriptors.data(), sizeof(d));
    d.op = abi::kOpReduceScatterSumV2 | abi::kOpPersistentBit | (slot << abi::kOpPersistentSlotShift);
    d.a2a.recv = {9, 0, 4096};  // Its staging.
    d.a2a.send_stride = send_stride;
    d.a2a.recv_stride = 1024;
    d.a2a.flags = abi::kAllToAllSkipSelf;
    d.a2a.reserved = 0;
    def.descriptors.assign(reinterpret_cast<const char*>(&d), sizeof(d));
    return def;
  };
  // Checked as on the ring: a stride shorter than a chunk is refused.
  const absl::Status bad = core.Resume(a->session->id(), a->session->secret(), 0, 0, {rs(1, 512)});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_NE(bad.message().find("captured op #3 (graph slot 1) handed back"), std::string::npos) << bad;
  ASSERT_TRUE(core.Resume(a->session->id(), a->session->secret(), 0, 0, {rs(1, 1024)}).ok());
  EXPECT_FALSE(a->job->has_persistent()) << "armed only once every rank is back";
  const absl::Status back = core.Resume(b->session->id(), b->session->secret(), 0, 0, {rs(6, 1024)});
  ASSERT_TRUE(back.ok()) << back;
  EXPECT_EQ(a->job->persistent_ops(), 1u);
}

TEST_F(RegistryCoreTest, AJobTakenBackStartsAfterTheNewestOpAnyRankSawDone) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto a = JoinBack(core, "job", 2, 0);
  auto b = JoinBack(core, "job", 2, 1);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_TRUE(a->job->all_joined());
  EXPECT_TRUE(core.Snapshot().empty()) << "not fed before every rank called Resume";
  // The earlier daemon died between the two ranks' done flags of op 41.
  abi::CompletionV1* ca = a->session->rank()->completion();
  abi::CompletionV1* cb = b->session->rank()->completion();
  abi::StoreRelease(&ca->done_seq, 41u);
  abi::StoreRelease(&cb->done_seq, 40u);
  EXPECT_EQ(core.Resume(a->session->id(), "wrong", 0, 0).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(core.Resume(a->session->id(), a->session->secret(), 1000, 3).ok());
  EXPECT_TRUE(core.Snapshot().empty()) << "rank 1 is not back yet";
  EXPECT_EQ(cb->done_seq, 40u);
  ASSERT_TRUE(core.Resume(b->session->id(), b->session->secret(), 2000, 4).ok());
  EXPECT_EQ(cb->done_seq, 41u) << "op 41 is done on every rank";
  EXPECT_EQ(ca->done_seq, 41u);
  EXPECT_TRUE(a->job->HandedOverDone(41));
  EXPECT_FALSE(a->job->HandedOverDone(42));
  EXPECT_EQ(a->session->rank()->next_publish, 42u);
  EXPECT_EQ(core.Snapshot().size(), 1u);
  EXPECT_EQ(core.handover().jobs_taken_over.load(), 1u);
  EXPECT_EQ(core.handover().ranks_resumed.load(), 2u);
  EXPECT_EQ(core.handover().ops_handed_over.load(), 7u);
  EXPECT_TRUE(core.Resume(b->session->id(), b->session->secret(), 0, 0).ok()) << "said twice: no-op";
  EXPECT_EQ(core.handover().ranks_resumed.load(), 2u);
}

TEST_F(RegistryCoreTest, ARankBackAndARankNewDoNotMakeOneJob) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  ASSERT_TRUE(JoinBack(core, "job", 2, 0).ok());
  auto fresh = JoinRank(core, "job", 2, 1);
  EXPECT_EQ(fresh.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(fresh.status().message().find("taken back"), std::string::npos) << fresh.status();

  ASSERT_TRUE(JoinRank(core, "running", 1, 0).ok());
  JoinSpec late = Spec("running", 1, 0, 1002);
  late.resume = true;
  auto again = core.Join(late, PeerCred{kUid, 0, kPid});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("runs on this dmagatherd already"), std::string::npos) << again.status();

  JoinSpec multi = Spec("multi", 2, 0, 1003);
  multi.resume = true;
  multi.job_id = "dmagather1/x";
  auto m = core.Join(multi, PeerCred{kUid, 0, kPid});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("multi-node"), std::string::npos) << m.status();
}

TEST_F(RegistryCoreTest, AResumedSessionRegistersUnderItsOldIdsOnlyBeforeResume) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto j = JoinBack(core, "job", 1, 0);
  ASSERT_TRUE(j.ok()) << j.status();
  RegisterSpec r = HostRegion(*j, 4096, HandOverBuffer(4096));
  r.region_id = 77;
  auto id = core.Register(r);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, 77u);
  RegisterSpec dup = HostRegion(*j, 8192, HandOverBuffer(8192));
  dup.region_id = 77;
  EXPECT_EQ(core.Register(dup).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(core.Resume(j->session->id(), j->session->secret(), 0, 0).ok());
  RegisterSpec later = HostRegion(*j, 8192, HandOverBuffer(8192));
  auto fresh = core.Register(later);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_GT(*fresh, 77u) << "new ids never meet the old ones";
  RegisterSpec asked = HostRegion(*j, 16384, HandOverBuffer(16384));
  asked.region_id = 500;
  EXPECT_EQ(core.Register(asked).status().code(), absl::StatusCode::kInvalidArgument) << "only before Resume";
}

TEST_F(RegistryCoreTest, ARankGoneBeforeResumeStartsTheJobFailedSoNoRankWaits) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  auto a = JoinBack(core, "job", 2, 0);
  auto b = JoinBack(core, "job", 2, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  abi::StoreRelease(&a->session->rank()->completion()->done_seq, 9u);
  ASSERT_TRUE(core.Resume(a->session->id(), a->session->secret(), 0, 0).ok());
  core.EndSession(*b);  // Rank 1 died before its Resume.
  EXPECT_TRUE(a->job->failed());
  EXPECT_TRUE(a->job->HandedOverDone(9));
  EXPECT_EQ(a->session->rank()->next_publish, 10u);
  EXPECT_EQ(core.Snapshot().size(), 1u) << "fed, so its ops end with the failure";
}

// A multi-node job coming back (after a daemon restart on some node): the
// ranks name their node's ranks, the Join answers once those are back,
// the last Resume tells the bootstrap the newest op done here; handed back
// again (the ring lost a node once more), it leaves the registry once
// nothing of it runs, its sessions' ends touch nothing, and the ranks'
// next Join makes a new job.
TEST_F(RegistryCoreTest, AMultiNodeJobComesBackAndCanBeHandedBackAgain) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  FakePeers peers;
  core.SetPeerJoiner(&peers);
  auto back = [&](int rank, std::vector<int> here) {
    JoinSpec s = Spec("mn", 4, rank, 1000 + rank);
    s.resume = true;
    s.job_id = "id-1";
    s.reconnect_s = 120;
    s.local_ranks = std::move(here);
    return core.Join(s, PeerCred{kUid, 0, kPid});
  };
  auto a = back(0, {0, 2});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->job->local_joined());
  auto stranger = back(1, {0, 1});  // Disagrees on this node's ranks.
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kFailedPrecondition) << stranger.status();
  auto b = back(2, {2, 0});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(a->job->local_joined());
  EXPECT_FALSE(a->job->all_joined()) << "complete only with its ring";
  EXPECT_EQ(core.Snapshot().size(), 1u) << "fed at once: the ingress thread starts it with its ring";
  EXPECT_EQ(peers.added.size(), 2u);

  abi::StoreRelease(&a->session->rank()->completion()->done_seq, 41u);
  abi::StoreRelease(&b->session->rank()->completion()->done_seq, 40u);
  uint32_t done = 0;
  ASSERT_TRUE(core.Resume(a->session->id(), a->session->secret(), 0, 0).ok());
  EXPECT_FALSE(a->job->resume_ready(&done));
  ASSERT_TRUE(core.Resume(b->session->id(), b->session->secret(), 0, 0).ok());
  ASSERT_TRUE(a->job->resume_ready(&done));
  EXPECT_EQ(done, 41u);
  EXPECT_FALSE(a->job->HandedOverDone(41)) << "started by the coordinator's table, not here";

  // The ring formed again is lost again: handed back.
  ASSERT_TRUE(a->job->HandBack(absl::AbortedError("node 1 failed")));
  DeferredFrees frees;
  core.Sweep(0, &frees);
  EXPECT_TRUE(a->job->handed_back());
  EXPECT_EQ(core.num_jobs(), 0);
  EXPECT_TRUE(core.Snapshot().empty());
  core.EndSession(*a);
  EXPECT_TRUE(frees.empty()) << "rank 2's session has not ended";
  core.EndSession(*b);
  core.Sweep(0, &frees);
  EXPECT_EQ(frees.size(), 2u);
  for (const Joined* j : {&*a, &*b}) {
    EXPECT_EQ(j->session->rank()->completion()->error_count, 0u) << "the hand-back wrote nothing";
  }
  auto again = back(0, {0, 2});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->job, a->job);
}

TEST_F(RegistryCoreTest, TheJobCreatedHookRunsOncePerNewJob) {
  RegistryCore core(&engine_, &tickets_, NoLimits());
  int created = 0;
  core.SetJobCreatedHook([&] { ++created; });
  ASSERT_TRUE(JoinRank(core, "a", 2, 0).ok());
  ASSERT_TRUE(JoinRank(core, "a", 2, 1).ok());
  ASSERT_TRUE(JoinRank(core, "b", 1, 0).ok());
  EXPECT_EQ(created, 2);
}

}  // namespace
}  // namespace dmagather::server::service

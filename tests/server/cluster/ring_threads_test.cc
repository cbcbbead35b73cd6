// Ring with its threads (send, receive, control reader, ticker) on the
// in-memory transport (tests/fakes/fake_transport.h): three "nodes" in one process, each
// a multi-node Job with one local rank. What the rank sees is read from its
// completion block, as the client would: the data in its output, done_seq,
// the error record's status and message. Waits are for a condition (with a
// generous bound that only turns a hang into a failure); nothing is decided
// by elapsed time.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "abi/completion_v1.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "server/cluster/ring.h"
#include "server/engines/copy_engine.h"
#include "server/scheduler/job.h"
#include "server/scheduler/op.h"
#include "server/scheduler/rank.h"
#include "tests/fakes/fake_transport.h"

namespace dmagather::server::cluster::testing {
namespace {

using scheduler::Job;
using scheduler::Op;
using scheduler::Rank;

constexpr uint64_t kShard = 200 * 1024 + 3;  // Bytes per rank: several chunks, an odd tail.

struct Node {
  std::unique_ptr<abi::CompletionV1> completion = std::make_unique<abi::CompletionV1>();
  std::shared_ptr<Rank> rank;
  std::unique_ptr<Job> job;
  std::shared_ptr<Ring> ring;
  std::vector<char> send, recv;
};

class Cluster {
 public:
  // One rank per node (rank r on node r), `links` links between neighbours;
  // `heartbeats`: the tickers send them (silence is never decided here).
  Cluster(int nodes, int links, bool heartbeats = true) : n_(nodes), links_(nodes * links) {
    auto topo_of = [&](int me) {
      auto t = std::make_shared<scheduler::Topology>();
      t->world_size = nodes;
      t->my_node = me;
      for (int r = 0; r < nodes; ++r) {
        t->node_ranks.push_back({r});
        t->node_names.push_back(absl::StrCat("host", r, " 10.0.0.", r + 1, ":7411"));
        t->node_of_rank.push_back(r);
      }
      return t;
    };
    std::vector<std::vector<std::unique_ptr<transport::Connection>>> to_next(nodes), from_prev(nodes);
    for (int i = 0; i < nodes; ++i) dead_.push_back(std::make_shared<std::atomic<bool>>(false));
    for (int a = 0; a < nodes; ++a) {
      for (int k = 0; k < links; ++k) {
        auto [ca, cb] = link(a, k).Make(absl::StrCat("node", a), absl::StrCat("node", (a + 1) % nodes), dead_[a],
                                        dead_[(a + 1) % nodes]);
        to_next[a].push_back(std::move(ca));
        from_prev[(a + 1) % nodes].push_back(std::move(cb));
      }
    }
    nodes_.resize(nodes);
    for (int i = 0; i < nodes; ++i) {
      Node& nd = nodes_[i];
      nd.rank = std::make_shared<Rank>(i, 100 + i, 0, nd.completion.get(), std::make_unique<engines::EngineRank>());
      nd.job = std::make_unique<Job>("threads", nodes, 0, /*multi_node=*/true);
      EXPECT_TRUE(nd.job->AddRank(nd.rank).ok());
      RingOptions o;
      o.chunk_bytes = 64 << 10;
      o.heartbeat_interval = heartbeats ? absl::Milliseconds(20) : absl::ZeroDuration();
      o.peer_timeout = absl::Hours(1);
      nd.ring = std::make_shared<Ring>(nd.job.get(), topo_of(i), std::move(to_next[i]), std::move(from_prev[i]), o);
      nd.ring->Run();
      EXPECT_TRUE(nd.job->SetTopology(topo_of(i), nd.ring).ok());
      nd.send.resize(kShard);
      for (uint64_t b = 0; b < kShard; ++b) nd.send[b] = char((b * 7 + uint64_t(i) * 131) & 0xff);
      nd.recv.assign(kShard * uint64_t(nodes), 0);
    }
  }
  ~Cluster() {
    for (Node& nd : nodes_) nd.job.reset();  // Closes the rings (Job's destructor).
  }

  FakeLink& link(int a, int k) { return links_[a * (links_.size() / n_) + k]; }
  Node& node(int i) { return nodes_[i]; }

  // The rank of node `i` submits op `seq` (the ring's part only: its own
  // shard is the engine's, not copied here).
  void Submit(int i, uint32_t seq) {
    Node& nd = nodes_[i];
    Op* op = nd.job->SlotFor(seq, common::MonotonicNs());
    ASSERT_NE(op, nullptr);
    scheduler::RankPart& p = op->parts[i];
    p.started = p.arrived = true;
    p.submit_ns = common::MonotonicNs();
    p.items = {scheduler::Item{scheduler::OpKind::kAllGather, /*uint8*/ 0, kShard, nd.send.data(), 0, 1}};
    p.recv = {nd.recv.data()};
    op->arrived = 1;
    op->open_parts.store(1);
    op->state.store(Op::kRunning);
    nd.rank->inflight.fetch_add(1);
    nd.ring->Start(op, absl::OkStatus(), -1);
  }

  // Until `cond` holds (false: it never did, within a bound far beyond need).
  template <typename F>
  bool WaitUntil(F cond) {
    for (int t = 0; t < 20000; ++t) {
      if (cond()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
  // Until the rank of node `i` sees op `seq` done.
  bool WaitDone(int i, uint32_t seq) {
    return WaitUntil([&] { return abi::LoadAcquire(&nodes_[i].completion->done_seq) >= seq; });
  }
  // Bytes written on link k from node a that node a+1 has not read.
  size_t Unread(int a, int k) {
    FakePipe& p = *link(a, k).forward;
    std::lock_guard<std::mutex> lock(p.mu);
    return p.bytes.size();
  }
  // The error record of op `seq` on node `i`'s rank (null: none).
  const abi::ErrorRecordV1* Error(int i, uint32_t seq) {
    const abi::CompletionV1& c = *nodes_[i].completion;
    for (const abi::ErrorRecordV1& e : c.errors) {
      if (e.stamp != 0 && e.seq == seq) return &e;
    }
    return nullptr;
  }

  // Node `i`'s daemon dies: every connection of it closes at once.
  void Kill(int i) {
    dead_[i]->store(true);  // First: nothing it sends from now on leaves.
    const int per = int(links_.size()) / n_;
    for (int k = 0; k < per; ++k) {
      link(i, k).a_end->Die();
      link((i + n_ - 1) % n_, k).b_end->Die();
    }
  }

 private:
  const int n_;
  std::vector<OwnerDead> dead_;
  std::vector<FakeLink> links_;
  std::vector<Node> nodes_;
};

TEST(RingThreadsTest, ThreeNodesGatherEveryShard) {
  Cluster c(3, 2);
  for (uint32_t seq = 1; seq <= 3; ++seq) {
    for (int i = 0; i < 3; ++i) c.Submit(i, seq);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.WaitDone(i, seq)) << "node " << i << " op " << seq;
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c.node(i).completion->error_count, 0u) << "node " << i << ": " << c.Error(i, 1)->message;
    for (int r = 0; r < 3; ++r) {
      if (r == i) continue;  // The engine's copy, not the ring's.
      EXPECT_EQ(memcmp(c.node(i).recv.data() + uint64_t(r) * kShard, c.node(r).send.data(), kShard), 0)
          << "node " << i << " holds a wrong shard of rank " << r;
    }
  }
}

TEST(RingThreadsTest, AKilledDaemonIsNamedOnEverySurvivingRank) {
  // No heartbeats: a heartbeat written to the dead node would also tell
  // node 0; this is about the abort coming back from node 1.
  Cluster c(3, 2, /*heartbeats=*/false);
  for (int i = 0; i < 3; ++i) c.Submit(i, 1);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.WaitDone(i, 1));
  // Op 2 under way on nodes 1 and 2; node 0's rank has not submitted it, so
  // its receivers wait with node 2's frames unread - and the end of node
  // 2's links behind them - when node 2's daemon dies.
  c.Submit(1, 2);
  c.Submit(2, 2);
  ASSERT_TRUE(c.WaitUntil([&] { return c.Unread(2, 0) + c.Unread(2, 1) > 0; }));
  c.Kill(2);
  ASSERT_TRUE(c.WaitUntil([&] { return c.node(0).job->failed() && c.node(1).job->failed(); }))
      << "a surviving node never learned of the death (its ops would time out)";
  c.Submit(0, 2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(c.WaitDone(i, 2)) << "node " << i << " never ended op 2";
    const abi::ErrorRecordV1* e = c.Error(i, 2);
    ASSERT_NE(e, nullptr) << "node " << i;
    EXPECT_EQ(e->status, 4) << "node " << i << ": " << e->message;  // PEER_FAILED
    EXPECT_TRUE(absl::StartsWith(e->message, "node 2 (host2 10.0.0.3:7411) failed"))
        << "node " << i << ": " << e->message;
  }
}

TEST(RingThreadsTest, AJobEndingOnOneNodeReachesTheOthers) {
  // Node 1's job goes away (its ranks left) after op 1: the others' next op
  // fails with its reason, not with a broken link.
  Cluster c(3, 1);
  for (int i = 0; i < 3; ++i) c.Submit(i, 1);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.WaitDone(i, 1));
  c.node(1).job->Fail(absl::AbortedError("rank 1 left the job"), 1);
  c.Submit(0, 2);
  c.Submit(2, 2);
  for (int i : {0, 2}) {
    ASSERT_TRUE(c.WaitDone(i, 2)) << "node " << i;
    const abi::ErrorRecordV1* e = c.Error(i, 2);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->status, 4) << e->message;
    EXPECT_STREQ(e->message, "node 1 (host1 10.0.0.2:7411): rank 1 left the job") << "node " << i;
  }
}

}  // namespace
}  // namespace dmagather::server::cluster::testing

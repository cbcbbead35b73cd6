// One suite over every transport's data link (tcp, and ibverbs on the fake
// verbs layer with several staging-ring shapes): frames arrive bit-exact
// whatever their size and however they are read back, both directions run
// at once, Shutdown unblocks blocked calls, and a peer that goes away fails
// the other end with UNAVAILABLE.
#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "server/transport/ibverbs_transport.h"
#include "server/transport/tcp_transport.h"
#include "tests/fakes/fake_verbs.h"
#include "tests/server/transport/link_util.h"

namespace dmagather::server::transport::testing {
namespace {

struct Backend {
  std::string name;
  bool ibverbs = false;
  bool roce = false;
  int slots = 0;
  size_t slot_bytes = 0;
};

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) { return info.param.name; }

class ConnectionTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    const Backend& be = GetParam();
    if (!be.ibverbs) {
      ta_ = MakeTcpTransport();
      tb_ = MakeTcpTransport();
    } else {
      for (const char* name : {"fake_hca0", "fake_hca1"}) {
        FakeVerbs::DeviceSpec spec;
        spec.name = name;
        spec.ethernet = be.roce;
        fake_.AddDevice(spec);
      }
      IbverbsOptions o;
      o.slots = be.slots;
      o.slot_bytes = be.slot_bytes;
      o.device = "fake_hca0";
      auto ta = MakeIbverbsTransport(&fake_, o);
      ASSERT_TRUE(ta.ok()) << ta.status();
      o.device = "fake_hca1";
      auto tb = MakeIbverbsTransport(&fake_, o);
      ASSERT_TRUE(tb.ok()) << tb.status();
      ta_ = std::move(*ta);
      tb_ = std::move(*tb);
    }
    auto p = MakeLinkPair(*ta_, *tb_);
    ASSERT_TRUE(p.ok()) << p.status();
    a_ = std::move(p->a);
    b_ = std::move(p->b);
  }

  void TearDown() override {
    a_.reset();
    b_.reset();
    ta_.reset();
    tb_.reset();
    if (GetParam().ibverbs) {
      EXPECT_EQ(fake_.live_objects(), 0) << "verbs objects leaked";
      EXPECT_EQ(fake_.cq_overflows(), 0);
    }
  }

  // The largest frame worth sending on this backend (small rings move one
  // slot per round trip).
  size_t MaxFrame() const {
    const size_t slot = GetParam().slot_bytes;
    return slot == 0 || slot >= (size_t{1} << 20) ? size_t{8} << 20 : 200 * slot;
  }

  // 0 B, 1 B, around one and two slots, 8 MiB (where that is sensible),
  // then random sizes.
  std::vector<size_t> Sizes(int random_count, uint64_t seed) const {
    std::vector<size_t> s = {0, 1, 255, 256, 4096, 65536};
    const size_t slot = GetParam().slot_bytes;
    if (slot > kHeaderBytes) {
      for (size_t v : {slot - kHeaderBytes - 1, slot - kHeaderBytes, slot - kHeaderBytes + 1, slot, slot + 1,
                       2 * slot - kHeaderBytes, 3 * slot + 7}) {
        s.push_back(v);
      }
    }
    s.push_back(size_t{1} << 20);
    s.push_back(MaxFrame());
    std::mt19937_64 rng(seed);
    const size_t top = std::min(MaxFrame(), std::max<size_t>(3 * slot, 256 << 10));
    for (int i = 0; i < random_count; ++i) s.push_back(rng() % (top + 1));
    return s;
  }

  FakeVerbs fake_;  // Outlives the transports and connections.
  std::unique_ptr<Transport> ta_, tb_;
  std::unique_ptr<Connection> a_, b_;
};

// Runs f on a thread; true if it finished within `limit`.
template <typename F>
bool FinishesWithin(std::future<F>& f, std::chrono::milliseconds limit) {
  return f.wait_for(limit) == std::future_status::ready;
}

TEST_P(ConnectionTest, FramesOfEverySizeArriveBitExact) {
  const std::vector<size_t> sizes = Sizes(40, 1);
  auto sender = std::async(std::launch::async, [&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (auto s = SendFrame(*a_, MakeFrame(i, sizes[i])); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(RecvAndCheckFrame(*b_, i).ok()) << "frame " << i << " of " << sizes[i] << " bytes";
  }
  EXPECT_TRUE(sender.get().ok());
}

TEST_P(ConnectionTest, PayloadsReadInPiecesArriveBitExact) {
  const std::vector<size_t> sizes = Sizes(20, 2);
  const size_t pieces[] = {7, 333, 4096, 65539};
  auto sender = std::async(std::launch::async, [&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (auto s = SendFrame(*a_, MakeFrame(100 + i, sizes[i])); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
  for (size_t i = 0; i < sizes.size(); ++i) {
    size_t piece = pieces[i % 4];
    if (sizes[i] / piece > 20000) piece = 65539;  // Keep tiny pieces to small frames.
    ASSERT_TRUE(RecvAndCheckFrame(*b_, 100 + i, piece).ok()) << "frame " << i << ", pieces of " << piece;
  }
  EXPECT_TRUE(sender.get().ok());
}

TEST_P(ConnectionTest, BothDirectionsAtOnce) {
  const std::vector<size_t> ab = Sizes(60, 3), ba = Sizes(60, 4);
  auto send = [](Connection* c, const std::vector<size_t>* sizes, uint64_t base) {
    for (size_t i = 0; i < sizes->size(); ++i) {
      if (auto s = SendFrame(*c, MakeFrame(base + i, (*sizes)[i])); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  auto recv = [](Connection* c, size_t n, uint64_t base) {
    for (size_t i = 0; i < n; ++i) {
      if (auto s = RecvAndCheckFrame(*c, base + i); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  auto s1 = std::async(std::launch::async, send, a_.get(), &ab, 1000);
  auto s2 = std::async(std::launch::async, send, b_.get(), &ba, 2000);
  auto r1 = std::async(std::launch::async, recv, b_.get(), ab.size(), 1000);
  auto r2 = std::async(std::launch::async, recv, a_.get(), ba.size(), 2000);
  EXPECT_TRUE(s1.get().ok());
  EXPECT_TRUE(s2.get().ok());
  auto a = r1.get(), b = r2.get();
  EXPECT_TRUE(a.ok()) << a;
  EXPECT_TRUE(b.ok()) << b;
}

TEST_P(ConnectionTest, ShutdownUnblocksRecv) {
  auto blocked = std::async(std::launch::async, [&] {
    char buf[kHeaderBytes];
    return b_->Recv(buf, sizeof(buf));
  });
  EXPECT_FALSE(FinishesWithin(blocked, std::chrono::milliseconds(100)));
  b_->Shutdown();
  ASSERT_TRUE(FinishesWithin(blocked, std::chrono::seconds(10)));
  absl::Status s = blocked.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST_P(ConnectionTest, ShutdownUnblocksSend) {
  // Nobody reads: the sender fills the socket buffers or the peer's ring,
  // then blocks.
  std::atomic<int> sent{0};
  auto blocked = std::async(std::launch::async, [&] {
    const Frame f = MakeFrame(7, 1 << 20);
    for (int i = 0; i < 1024; ++i) {
      if (auto s = SendFrame(*a_, f); !s.ok()) return s;
      sent.fetch_add(1);
    }
    return absl::InternalError("1 GiB went out with nobody reading");
  });
  EXPECT_FALSE(FinishesWithin(blocked, std::chrono::milliseconds(300)));
  a_->Shutdown();
  ASSERT_TRUE(FinishesWithin(blocked, std::chrono::seconds(10)));
  absl::Status s = blocked.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST_P(ConnectionTest, ShutdownFailsLaterCallsAndIsIdempotent) {
  a_->Shutdown();
  a_->Shutdown();
  const Frame f = MakeFrame(1, 10);
  EXPECT_EQ(SendFrame(*a_, f).code(), absl::StatusCode::kUnavailable);
  char buf[16];
  EXPECT_EQ(a_->Recv(buf, sizeof(buf)).code(), absl::StatusCode::kUnavailable);
}

TEST_P(ConnectionTest, PeerCloseFailsRecv) {
  auto blocked = std::async(std::launch::async, [&] {
    char buf[kHeaderBytes];
    return a_->Recv(buf, sizeof(buf));
  });
  EXPECT_FALSE(FinishesWithin(blocked, std::chrono::milliseconds(50)));
  b_.reset();
  ASSERT_TRUE(FinishesWithin(blocked, std::chrono::seconds(10)));
  absl::Status s = blocked.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("closed by the peer"), std::string::npos) << s;
}

TEST_P(ConnectionTest, FramesSentBeforeCloseAreDelivered) {
  const std::vector<size_t> sizes = Sizes(5, 5);
  auto sender = std::async(std::launch::async, [&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (auto s = SendFrame(*b_, MakeFrame(i, sizes[i])); !s.ok()) return s;
    }
    b_.reset();
    return absl::OkStatus();
  });
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(RecvAndCheckFrame(*a_, i).ok()) << "frame " << i;
  }
  EXPECT_TRUE(sender.get().ok());
  char buf[1];
  EXPECT_EQ(a_->Recv(buf, 1).code(), absl::StatusCode::kUnavailable);
}

TEST_P(ConnectionTest, PeerCloseFailsSend) {
  b_.reset();
  const Frame f = MakeFrame(3, 1000);
  absl::Status s;
  for (int i = 0; i < 2000 && s.ok(); ++i) {
    s = SendFrame(*a_, f);
    if (s.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

INSTANTIATE_TEST_SUITE_P(Transports, ConnectionTest,
                         ::testing::Values(Backend{"tcp"},
                                           // The default ring: 16 slots of 256 B + 1 MiB.
                                           Backend{"ibverbs", true, false, 16, 256 + (size_t{1} << 20)},
                                           Backend{"ibverbs_small_ring", true, false, 4, 4096},
                                           // RoCE addressing; odd slot size.
                                           Backend{"ibverbs_roce", true, true, 3, 1000},
                                           // One slot smaller than a header: every frame is split.
                                           Backend{"ibverbs_one_slot", true, false, 1, 200}),
                         BackendName);

}  // namespace
}  // namespace dmagather::server::transport::testing

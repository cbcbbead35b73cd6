// The ibverbs transport on the fake verbs layer: credits (a fast sender
// blocks rather than overwrite an unread slot), injected completion errors
// and queue-pair errors, device and GID selection, setup failures reported
// to both ends, options from the flags, and no leaked verbs objects.

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/transport/ibverbs_transport.h"
#include "server/transport/tcp_transport.h"
#include "tests/fakes/fake_verbs.h"
#include "tests/server/transport/link_util.h"

namespace dmagather::server::transport::testing {
namespace {

using ::testing::HasSubstr;

class IbverbsFakeTest : public ::testing::Test {
 protected:
  void AddDevices(bool ethernet = false) {
    for (const char* name : {"fake_hca0", "fake_hca1"}) {
      FakeVerbs::DeviceSpec spec;
      spec.name = name;
      spec.ethernet = ethernet;
      fake_.AddDevice(spec);
    }
  }
  // Two transports (two "nodes") and a link between them.
  void Link(int slots, size_t slot_bytes) {
    IbverbsOptions o;
    o.slots = slots;
    o.slot_bytes = slot_bytes;
    o.device = "fake_hca0";
    auto ta = MakeIbverbsTransport(&fake_, o);
    ASSERT_TRUE(ta.ok()) << ta.status();
    o.device = "fake_hca1";
    auto tb = MakeIbverbsTransport(&fake_, o);
    ASSERT_TRUE(tb.ok()) << tb.status();
    ta_ = std::move(*ta);
    tb_ = std::move(*tb);
    auto p = MakeLinkPair(*ta_, *tb_);
    ASSERT_TRUE(p.ok()) << p.status();
    a_ = std::move(p->a);
    b_ = std::move(p->b);
  }
  uint32_t QpOf(const char* device) {
    auto q = fake_.QpNumbers(device);
    EXPECT_EQ(q.size(), 1u);
    return q.empty() ? 0 : q[0];
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    ta_.reset();
    tb_.reset();
    EXPECT_EQ(fake_.live_objects(), 0) << "verbs objects leaked";
    EXPECT_EQ(fake_.cq_overflows(), 0);
  }

  FakeVerbs fake_;
  std::unique_ptr<Transport> ta_, tb_;
  std::unique_ptr<Connection> a_, b_;
};

TEST_F(IbverbsFakeTest, SenderBlocksWhenTheRingIsFullAndNeverOverwrites) {
  AddDevices();
  // 4 slots of one frame each (256-byte header + 768-byte payload).
  ASSERT_NO_FATAL_FAILURE(Link(4, 1024));
  std::atomic<int> sent{0};
  auto sender = std::async(std::launch::async, [&] {
    for (int i = 0; i < 40; ++i) {
      if (auto s = SendFrame(*a_, MakeFrame(i, 768)); !s.ok()) return s;
      sent.fetch_add(1);
    }
    return absl::OkStatus();
  });
  // The ring holds 4 frames: the sender gets there (however slowly the
  // machine runs it)...
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (sent.load() < 4 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(sent.load(), 4) << "the first 4 frames were never sent";
  // ...and no further: the fifth Send waits for a credit. (A pause gives a
  // wrong sender the chance to overwrite; a right one passes whatever it.)
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(sent.load(), 4);
  EXPECT_EQ(fake_.writes(), 4);
  // A slow reader: every frame still arrives intact.
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(RecvAndCheckFrame(*b_, i).ok()) << "frame " << i;
    if (i % 8 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_LE(fake_.writes(), i + 1 + 4) << "more frames in flight than slots";
  }
  EXPECT_TRUE(sender.get().ok());
  EXPECT_EQ(fake_.rnr_errors(), 0);
}

TEST_F(IbverbsFakeTest, ManyFramesFasterThanTheReader) {
  AddDevices();
  ASSERT_NO_FATAL_FAILURE(Link(8, 4096));
  auto sender = std::async(std::launch::async, [&] {
    for (int i = 0; i < 500; ++i) {
      if (auto s = SendFrame(*a_, MakeFrame(i, (i * 7919) % 20000)); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
  for (int i = 0; i < 500; ++i) {
    ASSERT_TRUE(RecvAndCheckFrame(*b_, i, 1000).ok()) << "frame " << i;
    if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(sender.get().ok());
  EXPECT_EQ(fake_.rnr_errors(), 0);
}

TEST_F(IbverbsFakeTest, CompletionErrorFailsBothEndsWithTheStatus) {
  AddDevices();
  ASSERT_NO_FATAL_FAILURE(Link(4, 4096));
  fake_.FailNextSend(QpOf("fake_hca0"), IBV_WC_REM_ACCESS_ERR);
  ASSERT_TRUE(SendFrame(*a_, MakeFrame(1, 100)).ok());  // Posted; it fails on the wire.
  char buf[kHeaderBytes];
  absl::Status sa = a_->Recv(buf, sizeof(buf));
  EXPECT_EQ(sa.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(sa.message()), HasSubstr("remote access error")) << sa;
  EXPECT_THAT(std::string(sa.message()), HasSubstr(a_->peer())) << sa;
  EXPECT_EQ(SendFrame(*a_, MakeFrame(2, 100)).code(), absl::StatusCode::kUnavailable);
  // The other end learns through the bootstrap connection.
  absl::Status sb = b_->Recv(buf, sizeof(buf));
  EXPECT_EQ(sb.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(sb.message()), HasSubstr("closed by the peer")) << sb;
}

TEST_F(IbverbsFakeTest, QueuePairErrorFailsABlockedRecv) {
  AddDevices();
  ASSERT_NO_FATAL_FAILURE(Link(4, 4096));
  auto blocked = std::async(std::launch::async, [&] {
    char buf[kHeaderBytes];
    return b_->Recv(buf, sizeof(buf));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  fake_.SetQpError(QpOf("fake_hca1"));
  ASSERT_EQ(blocked.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  absl::Status s = blocked.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("Work Request Flushed Error")) << s;
  char buf[1];
  absl::Status sa = a_->Recv(buf, 1);
  EXPECT_EQ(sa.code(), absl::StatusCode::kUnavailable) << sa;
}

TEST_F(IbverbsFakeTest, WriteToAPeerWhoseQueuePairIsGoneFailsTheSender) {
  AddDevices();
  ASSERT_NO_FATAL_FAILURE(Link(4, 4096));
  fake_.SetQpError(QpOf("fake_hca1"));  // The peer's adapter stops answering.
  ASSERT_TRUE(SendFrame(*a_, MakeFrame(1, 10)).ok());
  absl::Status s = SendFrame(*a_, MakeFrame(2, 10));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("retry")) << s;
}

TEST_F(IbverbsFakeTest, RoceUsesTheRoceV2Ipv4Gid) {
  AddDevices(/*ethernet=*/true);
  ASSERT_NO_FATAL_FAILURE(Link(4, 4096));
  EXPECT_EQ(fake_.SgidIndex(QpOf("fake_hca0")), 3);
  EXPECT_EQ(fake_.SgidIndex(QpOf("fake_hca1")), 3);
  auto sender = std::async(std::launch::async, [&] { return SendFrame(*a_, MakeFrame(9, 10000)); });
  EXPECT_TRUE(RecvAndCheckFrame(*b_, 9).ok());
  EXPECT_TRUE(sender.get().ok());
}

TEST_F(IbverbsFakeTest, NoDeviceIsUnavailable) {
  auto t = MakeIbverbsTransport(&fake_, IbverbsOptions{});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(t.status().message(), "no RDMA device (ibv_get_device_list found none)");
}

TEST_F(IbverbsFakeTest, DeviceWithoutAnActivePortIsUnavailable) {
  FakeVerbs::DeviceSpec spec;
  spec.name = "fake_down";
  spec.port_active = false;
  fake_.AddDevice(spec);
  auto t = MakeIbverbsTransport(&fake_, IbverbsOptions{});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("none has an active port"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("fake_down port 1: DOWN"));
}

TEST_F(IbverbsFakeTest, FirstDeviceWithAnActivePortIsChosen) {
  FakeVerbs::DeviceSpec down;
  down.name = "fake_down";
  down.port_active = false;
  fake_.AddDevice(down);
  AddDevices();
  IbverbsOptions o;
  auto t = MakeIbverbsTransport(&fake_, o);
  ASSERT_TRUE(t.ok()) << t.status();
  o.device = "fake_hca1";
  auto tb = MakeIbverbsTransport(&fake_, o);
  ASSERT_TRUE(tb.ok()) << tb.status();
  auto p = MakeLinkPair(**t, **tb);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(fake_.QpNumbers("fake_hca0").size(), 1u);
  EXPECT_EQ(fake_.QpNumbers("fake_hca1").size(), 1u);
  EXPECT_EQ(fake_.QpNumbers("fake_down").size(), 0u);
}

TEST_F(IbverbsFakeTest, UnknownDeviceNameIsUnavailable) {
  AddDevices();
  IbverbsOptions o;
  o.device = "mlx5_9";
  auto t = MakeIbverbsTransport(&fake_, o);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("'mlx5_9' (--ib_device) not found"));
}

TEST_F(IbverbsFakeTest, BadRingOptionsAreInvalid) {
  AddDevices();
  IbverbsOptions o;
  o.slots = 0;
  EXPECT_EQ(MakeIbverbsTransport(&fake_, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.slots = kIbverbsMaxSlots + 1;
  EXPECT_EQ(MakeIbverbsTransport(&fake_, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = IbverbsOptions{};
  o.slot_bytes = 0;
  EXPECT_EQ(MakeIbverbsTransport(&fake_, o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(IbverbsFakeTest, DifferentRingShapesOnTheTwoEnds) {
  AddDevices();
  IbverbsOptions o;
  o.device = "fake_hca0";
  o.slots = 2;
  o.slot_bytes = 3000;
  auto ta = MakeIbverbsTransport(&fake_, o);
  o.device = "fake_hca1";
  o.slots = 7;
  o.slot_bytes = 512;
  auto tb = MakeIbverbsTransport(&fake_, o);
  ASSERT_TRUE(ta.ok() && tb.ok());
  ta_ = std::move(*ta);
  tb_ = std::move(*tb);
  auto p = MakeLinkPair(*ta_, *tb_);
  ASSERT_TRUE(p.ok()) << p.status();
  a_ = std::move(p->a);
  b_ = std::move(p->b);
  auto s1 = std::async(std::launch::async, [&] {
    for (int i = 0; i < 50; ++i) {
      if (auto s = SendFrame(*a_, MakeFrame(i, i * 301)); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
  auto s2 = std::async(std::launch::async, [&] {
    for (int i = 0; i < 50; ++i) {
      if (auto s = SendFrame(*b_, MakeFrame(500 + i, i * 177)); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(RecvAndCheckFrame(*b_, i).ok());
    ASSERT_TRUE(RecvAndCheckFrame(*a_, 500 + i).ok());
  }
  EXPECT_TRUE(s1.get().ok());
  EXPECT_TRUE(s2.get().ok());
}

TEST_F(IbverbsFakeTest, LinkLayerMismatchFailsBothEnds) {
  FakeVerbs::DeviceSpec ib, roce;
  ib.name = "fake_ib";
  roce.name = "fake_roce";
  roce.ethernet = true;
  fake_.AddDevice(ib);
  fake_.AddDevice(roce);
  IbverbsOptions o;
  o.device = "fake_ib";
  auto ta = MakeIbverbsTransport(&fake_, o);
  o.device = "fake_roce";
  auto tb = MakeIbverbsTransport(&fake_, o);
  ASSERT_TRUE(ta.ok() && tb.ok());
  auto listener = (*tb)->Listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok());
  absl::Status sb;
  std::thread acceptor([&] {
    auto c = (*listener)->Accept();
    sb = c.ok() ? (*tb)->Upgrade(std::move(*c), false).status() : c.status();
  });
  auto c = (*ta)->Connect((*listener)->address(), absl::Seconds(5));
  ASSERT_TRUE(c.ok());
  absl::Status sa = (*ta)->Upgrade(std::move(*c), true).status();
  acceptor.join();
  EXPECT_EQ(sa.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sb.code(), absl::StatusCode::kUnavailable);
  // Each end finds the mismatch and names the other.
  EXPECT_THAT(std::string(sa.message()), HasSubstr("link layers differ")) << sa;
  EXPECT_THAT(std::string(sb.message()), HasSubstr("link layers differ")) << sb;
  EXPECT_THAT(std::string(sa.message()), HasSubstr("ibverbs setup with 127.0.0.1:")) << sa;
}

TEST_F(IbverbsFakeTest, SetupFailureOnOneEndIsToldToTheOther) {
  AddDevices();
  IbverbsOptions o;
  o.device = "fake_hca0";
  auto ta = MakeIbverbsTransport(&fake_, o);
  o.device = "fake_hca1";
  auto tb = MakeIbverbsTransport(&fake_, o);
  ASSERT_TRUE(ta.ok() && tb.ok());
  fake_.FailCreateQp("fake_hca1");
  auto p = MakeLinkPair(**ta, **tb);
  ASSERT_FALSE(p.ok());
  // The initiator (fake_hca0) is told why the acceptor could not set up.
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("initiator: "));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("the peer could not set up its end"));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("ibv_create_qp")) << p.status();
}

TEST_F(IbverbsFakeTest, PeerOnTcpIsReportedClearly) {
  AddDevices();
  IbverbsOptions o;
  o.device = "fake_hca0";
  auto ta = MakeIbverbsTransport(&fake_, o);
  ASSERT_TRUE(ta.ok());
  auto tb = MakeTcpTransport();
  auto listener = tb->Listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok());
  std::thread acceptor([&] {
    auto c = (*listener)->Accept();
    if (!c.ok()) return;
    auto up = tb->Upgrade(std::move(*c), false);
    // A tcp peer sends its first frame header.
    char header[kHeaderBytes] = {};
    (void)(*up)->Send(header, sizeof(header), nullptr, 0);
    char sink[kHeaderBytes];
    (void)(*up)->Recv(sink, sizeof(sink));
  });
  auto c = (*ta)->Connect((*listener)->address(), absl::Seconds(5));
  ASSERT_TRUE(c.ok());
  absl::Status s = (*ta)->Upgrade(std::move(*c), true).status();
  acceptor.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not using the ibverbs transport")) << s;
}

TEST(FlagsTest, OptionsFromFlags) {
  auto o = IbverbsOptionsFromFlags("mlx5_1:2", 3, 32, 65792);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device, "mlx5_1");
  EXPECT_EQ(o->port, 2);
  EXPECT_EQ(o->gid_index, 3);
  EXPECT_EQ(o->slots, 32);
  EXPECT_EQ(o->slot_bytes, 65792u);
}

TEST(FlagsTest, TheFlagsDefaultsAreTheOptionsDefaults) {
  // dmagatherd's defaults (server/flags/cluster.cc).
  auto o = IbverbsOptionsFromFlags("", -1, 16, 256 + (1 << 20));
  ASSERT_TRUE(o.ok());
  const IbverbsOptions d;
  EXPECT_EQ(o->device, d.device);
  EXPECT_EQ(o->port, d.port);
  EXPECT_EQ(o->gid_index, d.gid_index);
  EXPECT_EQ(o->slots, d.slots);
  EXPECT_EQ(o->slot_bytes, d.slot_bytes);
  EXPECT_EQ(d.device, "");
  EXPECT_EQ(d.port, 0);
  EXPECT_EQ(d.gid_index, -1);
  EXPECT_EQ(d.slots, 16);
  EXPECT_EQ(d.slot_bytes, 256u + (1u << 20));
}

TEST(FlagsTest, BadValuesNameTheFlag) {
  auto o = IbverbsOptionsFromFlags("mlx5_0:x", -1, 16, 4096);
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("--ib_device"));
  o = IbverbsOptionsFromFlags("", -1, 16, 0);
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("--ib_slot_bytes"));
}

}  // namespace
}  // namespace dmagather::server::transport::testing

// The seams of the v2 client/daemon contract through a real daemon and real
// rank processes: per-op handles (wait / test / wait_stream), coalesced ops,
// collective fallback and refusals (one verdict for every rank), the meaning
// of FALLBACK vs INVALID_ARGUMENT, and session secrets (a process that knows
// or guesses session ids cannot Leave or Deregister someone else's session).
//
// Every case runs in forked processes: the test process itself never uses
// gRPC, so forking stays safe.
#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <regex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/comm.h"
#include "common/api_names.h"
#include "common/clock.h"
#include "common/status.h"
#include "dmagather/client.h"
#include "dmagather/dmagather.h"
#include "dmagather/v1/control.grpc.pb.h"
#include "tests/integration/harness.h"
#include "tests/integration/rank_checks.h"
#include "tests/support/verify.h"

namespace dmagather::testing {
namespace {

using support::FillPattern;

// A counting barrier in shared memory for `n` processes, reusable by
// generation.
struct Barrier {
  std::atomic<int> count{0};
  std::atomic<int> generation{0};
  bool Arrive(int n) {
    const int gen = generation.load();
    if (count.fetch_add(1) + 1 == n) {
      count.store(0);
      generation.fetch_add(1);
      return true;
    }
    return WaitFor([&] { return generation.load() != gen; });
  }
};

std::string Status(dmagather_status_t s) { return dmagather_status_string(s); }

long FirstNot(const char* p, size_t bytes, char v) {
  for (size_t i = 0; i < bytes; ++i) {
    if (p[i] != v) return long(i);
  }
  return -1;
}

void ExpectAllPassed(const std::vector<RankReport>& reports) {
  for (size_t r = 0; r < reports.size(); ++r) {
    EXPECT_EQ(reports[r].exit_code, 0) << "rank " << r << ": " << reports[r].message;
  }
}

// ---------------------------------------------------------------- a.

TEST(SeamsTest, PerOpWaitAndTest) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  struct Shared {
    std::atomic<int> rank0_tested{0};
  };
  auto* sh = SharedPage<Shared>();
  const std::string job = UniqueJob("perop");
  const int world = 3;
  struct Spec {
    size_t count;
    dmagather_dtype_t dtype;
    bool in_place;
  };
  const std::vector<Spec> specs = {{1000, DMAGATHER_FLOAT32, false},
                                   {1, DMAGATHER_UINT8, true},
                                   {65537, DMAGATHER_BFLOAT16, false},
                                   {333, DMAGATHER_INT64, true}};
  auto reports = RunRanks(world, [&](int rank, const Reporter& rep) {
    Comm comm(daemon->socket().c_str(), job, world, rank);
    REQUIRE(comm.ok(), comm.error());
    dmagather_comm_t c = comm.get();
    if (rank != 0) {
      // Rank 0 submits and tests alone first: its ops cannot be done yet.
      REQUIRE(WaitFor([&] { return sh->rank0_tested.load() != 0; }), "rank 0 never tested");
    }
    std::vector<char*> sends, recvs;
    std::vector<dmagather_op_t> ops;
    for (size_t i = 0; i < specs.size(); ++i) {
      const size_t shard = specs[i].count * dmagather_dtype_size(specs[i].dtype);
      char* recv = static_cast<char*>(comm.Alloc(shard * world));
      REQUIRE(recv != nullptr, comm.error());
      std::memset(recv, 0xEE, shard * world);
      char* send = specs[i].in_place ? recv + rank * shard : static_cast<char*>(comm.Alloc(shard));
      REQUIRE(send != nullptr, comm.error());
      FillPattern(send, shard, 100 + i, rank);
      dmagather_op_t op = 0;
      dmagather_status_t st = dmagather_allgather_async(c, send, recv, specs[i].count, specs[i].dtype, nullptr, &op);
      REQUIRE(st == DMAGATHER_OK, Status(st) + " " + comm.error());
      REQUIRE(op == i + 1, absl::StrCat("op handle ", op, " for the op #", i + 1));
      sends.push_back(send);
      recvs.push_back(recv);
      ops.push_back(op);
    }
    if (rank == 0) {
      for (dmagather_op_t op : ops) {
        int done = -1;
        dmagather_status_t st = dmagather_op_test(c, op, &done);
        REQUIRE(st == DMAGATHER_OK, Status(st) + " " + comm.error());
        REQUIRE(done == 0, absl::StrCat("op ", op, " done before ranks 1,2 submitted it"));
      }
      sh->rank0_tested.store(1);
    }
    // Waited in reverse order: the last op's wait covers nothing of the others.
    for (size_t k = ops.size(); k-- > 0;) {
      dmagather_status_t st = dmagather_op_wait(c, ops[k]);
      REQUIRE(st == DMAGATHER_OK, Status(st) + " " + comm.error());
      const size_t shard = specs[k].count * dmagather_dtype_size(specs[k].dtype);
      long bad = FirstMismatch(recvs[k], shard, world, 100 + k);
      REQUIRE(bad < 0, absl::StrCat("op ", ops[k], " output differs at byte ", bad));
      int done = -1;
      st = dmagather_op_test(c, ops[k], &done);
      REQUIRE(st == DMAGATHER_OK && done == 1, absl::StrCat(Status(st), " done=", done));
    }
    // Handles that name no op.
    dmagather_status_t st = dmagather_op_wait(c, 0);
    REQUIRE(st == DMAGATHER_INVALID_ARGUMENT, Status(st));
    st = dmagather_op_wait(c, ops.size() + 1);
    REQUIRE(st == DMAGATHER_INVALID_ARGUMENT, Status(st));
    REQUIRE(Contains(dmagather_last_error(c), "was not submitted"), dmagather_last_error(c));
    st = dmagather_op_wait(c, 1000000);
    REQUIRE(st == DMAGATHER_INVALID_ARGUMENT, Status(st));
    int done = -1;
    st = dmagather_op_test(c, 0, &done);
    REQUIRE(st == DMAGATHER_INVALID_ARGUMENT && done == 0, absl::StrCat(Status(st), " done=", done));
    st = dmagather_op_test(c, ops.size() + 1, &done);
    REQUIRE(st == DMAGATHER_INVALID_ARGUMENT && done == 0, absl::StrCat(Status(st), " done=", done));
    st = dmagather_op_wait_stream(c, ops.size() + 1, nullptr);
    REQUIRE(st == DMAGATHER_INVALID_ARGUMENT, Status(st));

    // op_wait_stream on the host backend: NULL stream is op_wait; anything
    // else is INVALID_ARGUMENT (and never waits the op away).
    const size_t count = 4097, shard = count * 4;
    char* recv = static_cast<char*>(comm.Alloc(shard * world));
    REQUIRE(recv != nullptr, comm.error());
    std::memset(recv, 0xEE, shard * world);
    FillPattern(recv + rank * shard, shard, 7, rank);
    dmagather_op_t op = 0;
    st = dmagather_allgather_async(c, recv + rank * shard, recv, count, DMAGATHER_INT32, nullptr, &op);
    REQUIRE(st == DMAGATHER_OK && op == ops.size() + 1, absl::StrCat(Status(st), " op ", op));
    int fake_stream = 0;
    st = dmagather_op_wait_stream(c, op, &fake_stream);
    REQUIRE(st == DMAGATHER_INVALID_ARGUMENT, Status(st));
    REQUIRE(Contains(dmagather_last_error(c), "takes no stream"), dmagather_last_error(c));
    st = dmagather_op_wait_stream(c, op, nullptr);
    REQUIRE(st == DMAGATHER_OK, Status(st) + " " + comm.error());
    long bad = FirstMismatch(recv, shard, world, 7);
    REQUIRE(bad < 0, absl::StrCat("wait_stream op output differs at byte ", bad));
    st = dmagather_op_test(c, op, &done);
    REQUIRE(st == DMAGATHER_OK && done == 1, absl::StrCat(Status(st), " done=", done));
    return 0;
  });
  ExpectAllPassed(reports);
  FreeSharedPage(sh);
}

// ---------------------------------------------------------------- b.

struct CoalescedItem {
  dmagather_dtype_t dtype;
  size_t count;
  bool in_place;
};
const std::vector<CoalescedItem> kItems = {{DMAGATHER_UINT8, 1, false},
                                           {DMAGATHER_FLOAT16, 3, true},
                                           {DMAGATHER_INT64, 4095, false},
                                           {DMAGATHER_FLOAT32, (size_t{1} << 20) + 7, true},
                                           {DMAGATHER_FLOAT64, 17, false}};

TEST(SeamsTest, CoalescedOpIsBitExactAndDisagreementIsNamed) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  const std::string job = UniqueJob("coalesced");
  const int world = 3;
  auto reports = RunRanks(world, [&](int rank, const Reporter& rep) {
    Comm comm(daemon->socket().c_str(), job, world, rank);
    REQUIRE(comm.ok(), comm.error());
    dmagather_comm_t c = comm.get();
    const size_t n = kItems.size();
    std::vector<char*> out(n), own(n);
    std::vector<size_t> shard(n);
    for (size_t i = 0; i < n; ++i) {
      shard[i] = kItems[i].count * dmagather_dtype_size(kItems[i].dtype);
      out[i] = static_cast<char*>(comm.Alloc(shard[i] * world));
      REQUIRE(out[i] != nullptr, comm.error());
      own[i] = kItems[i].in_place ? out[i] + rank * shard[i] : static_cast<char*>(comm.Alloc(shard[i]));
      REQUIRE(own[i] != nullptr, comm.error());
    }
    // One coalesced op with seed base `seed`; `count_delta` changes item 2's
    // count on this rank.
    auto submit = [&](uint64_t seed, long count_delta, dmagather_op_t* op) {
      std::vector<dmagather_gather_t> g(n);
      for (size_t i = 0; i < n; ++i) {
        std::memset(out[i], 0xEE, shard[i] * world);
        FillPattern(own[i], shard[i], seed + i, rank);
        g[i] = dmagather_gather_t{own[i], out[i], kItems[i].count, kItems[i].dtype};
      }
      g[2].count += count_delta;
      return dmagather_allgather_coalesced(c, g.data(), n, nullptr, op);
    };
    auto check = [&](uint64_t seed) -> std::string {
      for (size_t i = 0; i < n; ++i) {
        long bad = FirstMismatch(out[i], shard[i], world, seed + i);
        if (bad >= 0) return absl::StrCat("item ", i, " differs at byte ", bad);
      }
      return "";
    };

    dmagather_op_t op = 0;
    dmagather_status_t st = submit(1000, 0, &op);
    REQUIRE(st == DMAGATHER_OK && op == 1, absl::StrCat(Status(st), " op ", op, " ", comm.error()));
    st = dmagather_op_wait(c, op);
    REQUIRE(st == DMAGATHER_OK, Status(st) + " " + comm.error());
    std::string why = check(1000);
    REQUIRE(why.empty(), why);

    // Rank 2 disagrees on item 2's count: INVALID_ARGUMENT everywhere,
    // naming rank 2, and nothing written.
    st = submit(2000, rank == 2 ? -1 : 0, &op);
    REQUIRE(st == DMAGATHER_OK && op == 2, absl::StrCat(Status(st), " op ", op, " ", comm.error()));
    st = dmagather_op_wait(c, op);
    const std::string msg = dmagather_last_error(c);
    REQUIRE(st == DMAGATHER_INVALID_ARGUMENT, Status(st) + " " + msg);
    REQUIRE(Contains(msg, "ranks 2 differ from rank 0"), msg);
    // The differing item first, both sides, within the record's 240 bytes.
    REQUIRE(Contains(msg, "rank 0 asked for item 2 allgather count=4095 dtype=int64"), msg);
    REQUIRE(Contains(msg, "rank 2 for item 2 allgather count=4094 dtype=int64"), msg);
    for (size_t i = 0; i < n; ++i) {
      for (int r = 0; r < world; ++r) {
        if (kItems[i].in_place && r == rank) continue;  // This rank's own input.
        long bad = FirstNot(out[i] + r * shard[i], shard[i], char(0xEE));
        REQUIRE(bad < 0, absl::StrCat("failed op wrote item ", i, " slot ", r, " at ", bad));
      }
    }

    // The job goes on: the next coalesced op is bit-exact.
    st = submit(3000, 0, &op);
    REQUIRE(st == DMAGATHER_OK && op == 3, absl::StrCat(Status(st), " op ", op, " ", comm.error()));
    st = dmagather_op_wait(c, op);
    REQUIRE(st == DMAGATHER_OK, Status(st) + " " + comm.error());
    why = check(3000);
    REQUIRE(why.empty(), why);
    return 0;
  });
  ExpectAllPassed(reports);
}

// ---------------------------------------------------------------- c.

uint64_t JsonNumber(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\": \"?([0-9]+)\"?");
  return std::regex_search(json, m, re) ? std::stoull(m[1]) : ~0ull;
}

TEST(SeamsTest, CollectiveFallbackAndRefusalGiveEveryRankOneVerdict) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  struct Shared {
    Barrier barrier;
    std::atomic<int> ready{0};
    std::atomic<int> release{0};
  };
  auto* sh = SharedPage<Shared>();
  const std::string job = UniqueJob("fallback");
  const int world = 3;
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::make_unique<RankProcess>(r, [&](int rank, const Reporter& rep) {
      Comm comm(daemon->socket().c_str(), job, world, rank);
      REQUIRE(comm.ok(), comm.error());
      dmagather_comm_t c = comm.get();
      const size_t count = 10000, shard = count * 2;
      char* send = static_cast<char*>(comm.Alloc(shard));
      char* recv = static_cast<char*>(comm.Alloc(shard * world));
      REQUIRE(send != nullptr && recv != nullptr, comm.error());
      auto good_op = [&](uint64_t seed, dmagather_op_t want) -> std::string {
        std::memset(recv, 0xEE, shard * world);
        FillPattern(send, shard, seed, rank);
        dmagather_op_t op = 0;
        dmagather_status_t st = dmagather_allgather_async(c, send, recv, count, DMAGATHER_FLOAT16, nullptr, &op);
        if (st != DMAGATHER_OK || op != want)
          return absl::StrCat("submit: ", Status(st), " op ", op, " ", comm.error());
        st = dmagather_op_wait(c, op);
        if (st != DMAGATHER_OK) return absl::StrCat("wait: ", Status(st), " ", comm.error());
        long bad = FirstMismatch(recv, shard, world, seed);
        return bad < 0 ? "" : absl::StrCat("op ", op, " output differs at byte ", bad);
      };

      // Op 1: rank 1 declines, ranks 0 and 2 submit a real allgather.
      std::memset(recv, 0xA5, shard * world);
      FillPattern(send, shard, 11, rank);
      dmagather_op_t op = 0;
      dmagather_status_t st;
      if (rank == 1) {
        st = dmagather_submit_fallback(c, "my tensors are unsuitable", &op);
        REQUIRE(st == DMAGATHER_FALLBACK, Status(st) + " " + comm.error());
      } else {
        st = dmagather_allgather_async(c, send, recv, count, DMAGATHER_FLOAT16, nullptr, &op);
        REQUIRE(st == DMAGATHER_OK, Status(st) + " " + comm.error());
      }
      REQUIRE(op == 1, absl::StrCat("op ", op));
      st = dmagather_op_wait(c, op);
      std::string msg = dmagather_last_error(c);
      REQUIRE(st == DMAGATHER_FALLBACK, Status(st) + " " + msg);
      REQUIRE(Contains(msg, "my tensors are unsuitable"), msg);
      REQUIRE(Contains(msg, "rank 1"), msg);
      int done = -1;
      st = dmagather_op_test(c, op, &done);
      REQUIRE(st == DMAGATHER_FALLBACK && done == 1, absl::StrCat(Status(st), " done=", done));
      long bad = FirstNot(recv, shard * world, char(0xA5));
      REQUIRE(bad < 0, absl::StrCat("output written by an op that fell back, at byte ", bad));

      // Op 2: everyone takes part again.
      std::string why = good_op(12, 2);
      REQUIRE(why.empty(), why);

      // Op 3: rank 1's send is private memory (INVALID_ARGUMENT locally);
      // every rank learns it at once.
      std::vector<char> private_mem(shard);
      std::memset(recv, 0xA5, shard * world);
      REQUIRE(sh->barrier.Arrive(world), "barrier");
      const uint64_t t0 = common::MonotonicNs();
      if (rank == 1) {
        st = dmagather_allgather_async(c, private_mem.data(), recv, count, DMAGATHER_FLOAT16, nullptr, &op);
        REQUIRE(st == DMAGATHER_INVALID_ARGUMENT, Status(st) + " " + comm.error());
        REQUIRE(Contains(dmagather_last_error(c), "not inside memory from dmagather_alloc"), dmagather_last_error(c));
      } else {
        st = dmagather_allgather_async(c, send, recv, count, DMAGATHER_FLOAT16, nullptr, &op);
        REQUIRE(st == DMAGATHER_OK, Status(st) + " " + comm.error());
      }
      REQUIRE(op == 3, absl::StrCat("op ", op));
      st = dmagather_op_wait(c, op);
      const double secs = (common::MonotonicNs() - t0) / 1e9;
      msg = dmagather_last_error(c);
      REQUIRE(st == DMAGATHER_INVALID_ARGUMENT, Status(st) + " " + msg);
      REQUIRE(Contains(msg, "rank 1") && Contains(msg, "not inside memory from dmagather_alloc"), msg);
      REQUIRE(secs < 1.0, absl::StrCat("verdict took ", secs, " s"));
      bad = FirstNot(recv, shard * world, char(0xA5));
      REQUIRE(bad < 0, absl::StrCat("output written by a refused op, at byte ", bad));

      // Op 4: the job goes on.
      why = good_op(14, 4);
      REQUIRE(why.empty(), why);

      sh->ready++;
      REQUIRE(WaitFor([&] { return sh->release.load() != 0; }, 60), "never released");
      return 0;
    }));
  }
  ASSERT_TRUE(WaitFor([&] { return sh->ready.load() == world; }, 60)) << "ranks did not finish their ops";

  int rc = 0;
  const std::string sock = "--socket=" + daemon->socket();
  std::string json = RunProgram({"tools/dmagatherctl", sock, "--json", "stats", "--job=" + job}, &rc);
  EXPECT_EQ(rc, 0) << json;
  EXPECT_EQ(JsonNumber(json, "fallback_ops"), 1u) << json;
  EXPECT_EQ(JsonNumber(json, "ops"), 2u) << json;  // Ops 2 and 4.
  std::smatch m;
  EXPECT_TRUE(
      std::regex_search(json, m, std::regex("\"reason\": \"op_refused_by_rank\",\\s*\"count\": \"?([0-9]+)\"?")))
      << json;
  if (!m.empty()) EXPECT_EQ(m[1], "1") << json;
  EXPECT_TRUE(std::regex_search(json, std::regex("\"code\": \"FALLBACK\",\\s*\"count\": \"?3\"?"))) << json;

  sh->release.store(1);
  for (size_t r = 0; r < ranks.size(); ++r) {
    RankReport rep = ranks[r]->Reap(30);
    EXPECT_EQ(rep.exit_code, 0) << "rank " << r << ": " << rep.message;
  }
  FreeSharedPage(sh);
}

// ---------------------------------------------------------------- d.

TEST(SeamsTest, MisuseIsInvalidArgumentAndUnreachableMemoryIsFallback) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  const std::string job = UniqueJob("meanings");
  auto reports = RunRanks(1, [&](int, const Reporter& rep) {
    client::CommOptions o;
    o.socket_path = daemon->socket();
    o.job_key = job;
    o.world_size = 1;
    o.rank = 0;
    auto created = client::CommImpl::Create(o);
    REQUIRE(created.ok(), created.status().ToString());
    std::unique_ptr<client::CommImpl> comm = *std::move(created);
    auto buf = comm->Alloc(1 << 16);
    REQUIRE(buf.ok(), buf.status().ToString());
    char* p = static_cast<char*>(*buf);

    // Memory the host backend cannot reach: FALLBACK, as the API code too.
    std::vector<char> private_mem(4096);
    absl::Status s = comm->Register(private_mem.data(), private_mem.size());
    REQUIRE(common::IsFallback(s), s.ToString());
    REQUIRE(common::ToApiStatus(s) == DMAGATHER_FALLBACK, s.ToString());

    // A working op first, so the handles below are real ones.
    uint64_t op = 0;
    void* out = p + 1024;
    client::GatherItem item{false, p + 1024, &out, 64, DMAGATHER_UINT8};  // In place (world 1: slot 0).
    s = comm->Submit(&item, 1, nullptr, &op);
    REQUIRE(s.ok() && op == 1, s.ToString());
    s = comm->OpWait(op);
    REQUIRE(s.ok(), s.ToString());

    REQUIRE(comm->Close().ok(), "close");
    auto expect_misuse = [&](const absl::Status& st, const char* what) -> std::string {
      if (st.code() != absl::StatusCode::kInvalidArgument || common::IsFallback(st) ||
          common::ToApiStatus(st) != DMAGATHER_INVALID_ARGUMENT) {
        return absl::StrCat(what, " after Close: ", st.ToString());
      }
      return "";
    };
    std::string why;
    why += expect_misuse(comm->Submit(&item, 1, nullptr, &op), "Submit");
    REQUIRE(op == 0, absl::StrCat("Submit after Close gave op ", op));
    why += expect_misuse(comm->SubmitFallback("x", &op), "SubmitFallback");
    why += expect_misuse(comm->Wait(), "Wait");
    why += expect_misuse(comm->OpWait(1), "OpWait");
    why += expect_misuse(comm->OpWaitStream(1, nullptr), "OpWaitStream");
    absl::Status op_status;
    why += expect_misuse(comm->OpTest(1, &op_status).status(), "OpTest");
    why += expect_misuse(comm->Alloc(4096).status(), "Alloc");
    why += expect_misuse(comm->Register(private_mem.data(), private_mem.size()), "Register");
    why += expect_misuse(comm->AllGather(p, p, 1, DMAGATHER_UINT8, nullptr), "AllGather");
    REQUIRE(why.empty(), why);
    comm.reset();

    // Through the C ABI: dmagather_register of private memory is FALLBACK.
    Comm c(daemon->socket().c_str(), job + "-c", 1, 0);
    REQUIRE(c.ok(), c.error());
    dmagather_status_t st = dmagather_register(c.get(), private_mem.data(), private_mem.size());
    REQUIRE(st == DMAGATHER_FALLBACK, Status(st) + " " + c.error());
    REQUIRE(!c.error().empty(), "no reason given");
    // A misused handle is INVALID_ARGUMENT, never FALLBACK.
    st = dmagather_op_wait(c.get(), 1);
    REQUIRE(st == DMAGATHER_INVALID_ARGUMENT, Status(st));
    return 0;
  });
  ExpectAllPassed(reports);
}

// ---------------------------------------------------------------- e.

TEST(SeamsTest, ForeignProcessCannotLeaveOrDeregisterOtherSessions) {
  auto daemon = DaemonProcess::Start({"--socket_mode=0666", "--op_timeout_s=10"});
  ASSERT_NE(daemon, nullptr);
  // The socket's directory is the test's private 0700 mkdtemp: let the other
  // uid reach the (0666) socket.
  ASSERT_EQ(chmod(daemon->dir().c_str(), 0755), 0);
  struct Shared {
    std::atomic<int> ready{0};
    std::atomic<int> attacked{0};
  };
  auto* sh = SharedPage<Shared>();
  const std::string job = UniqueJob("secrets");
  const int world = 2;
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::make_unique<RankProcess>(r, [&](int rank, const Reporter& rep) {
      dmagather_comm_t c = nullptr;
      dmagather_status_t st = dmagather_comm_init(daemon->socket().c_str(), job.c_str(), world, rank, &c);
      REQUIRE(st == DMAGATHER_OK, Status(st) + " " + dmagather_last_error(nullptr));
      const size_t count = 50000, shard = count * 4;
      void *sendp = nullptr, *recvp = nullptr;
      st = dmagather_alloc(c, shard, &sendp);
      REQUIRE(st == DMAGATHER_OK, dmagather_last_error(c));
      st = dmagather_alloc(c, shard * world, &recvp);
      REQUIRE(st == DMAGATHER_OK, dmagather_last_error(c));
      char* send = static_cast<char*>(sendp);
      char* recv = static_cast<char*>(recvp);
      auto run = [&](uint64_t seed) -> std::string {
        std::memset(recv, 0xEE, shard * world);
        FillPattern(send, shard, seed, rank);
        dmagather_op_t op = 0;
        dmagather_status_t s = dmagather_allgather_async(c, send, recv, count, DMAGATHER_FLOAT32, nullptr, &op);
        if (s != DMAGATHER_OK) return absl::StrCat("submit: ", Status(s), " ", dmagather_last_error(c));
        s = dmagather_op_wait(c, op);
        if (s != DMAGATHER_OK) return absl::StrCat("wait: ", Status(s), " ", dmagather_last_error(c));
        long bad = FirstMismatch(recv, shard, world, seed);
        return bad < 0 ? "" : absl::StrCat("output differs at byte ", bad);
      };
      std::string why = run(21);
      REQUIRE(why.empty(), why);
      sh->ready++;
      REQUIRE(WaitFor([&] { return sh->attacked.load() != 0; }, 60), "attacker never finished");
      why = run(22);  // Neither Leave nor Deregister reached this session.
      REQUIRE(why.empty(), why);
      why = run(23);
      REQUIRE(why.empty(), why);
      st = dmagather_free(c, sendp);  // Deregister with the real secret still works.
      REQUIRE(st == DMAGATHER_OK, Status(st) + " " + dmagather_last_error(c));
      st = dmagather_comm_destroy(c);  // Leave with the real secret.
      REQUIRE(st == DMAGATHER_OK, Status(st) + " " + dmagather_last_error(nullptr));
      return 0;
    }));
  }
  ASSERT_TRUE(WaitFor([&] { return sh->ready.load() == world; }, 60)) << "job did not start";

  const std::string socket = daemon->socket();
  RankProcess attacker(0, [&](int, const Reporter& rep) {
    std::string mode = "same uid (not root)";
    if (geteuid() == 0) {
      if (setgroups(0, nullptr) == 0 && setgid(65534) == 0 && setuid(65534) == 0) {
        mode = "uid 65534 (nobody)";
      } else {
        mode = absl::StrCat("same uid (root, but setuid to 65534 failed: ", strerror(errno), ")");
      }
    }
    auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
    REQUIRE(channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5)),
            mode + ": cannot connect to the daemon's socket");
    auto stub = v1::Control::NewStub(channel);
    std::mt19937_64 rng(std::random_device{}());
    std::string random_secret(16, '\0');
    for (char& ch : random_secret) ch = char(rng());
    int calls = 0;
    std::string wrong;
    for (uint64_t id = 1; id <= 64; ++id) {
      for (const std::string& secret : {std::string(), random_secret}) {
        grpc::ClientContext lctx;
        lctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        v1::LeaveRequest lreq;
        lreq.set_session_id(id);
        lreq.set_session_secret(secret);
        v1::LeaveReply lrep;
        grpc::Status s = stub->Leave(&lctx, lreq, &lrep);
        ++calls;
        if (s.error_code() != grpc::StatusCode::NOT_FOUND) {
          wrong += absl::StrCat("Leave(", id, ", ", secret.size(), "-byte secret): ", int(s.error_code()), " ",
                                s.error_message(), "; ");
        }
        for (uint32_t region = 1; region <= 4; ++region) {
          grpc::ClientContext dctx;
          dctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
          v1::DeregisterRequest dreq;
          dreq.set_session_id(id);
          dreq.set_session_secret(secret);
          dreq.set_region_id(region);
          v1::DeregisterReply drep;
          s = stub->Deregister(&dctx, dreq, &drep);
          ++calls;
          if (s.error_code() != grpc::StatusCode::NOT_FOUND) {
            wrong += absl::StrCat("Deregister(", id, ", region ", region, ", ", secret.size(),
                                  "-byte secret): ", int(s.error_code()), " ", s.error_message(), "; ");
          }
        }
      }
    }
    rep.Say(absl::StrCat(mode, ": ", calls, " calls; ", wrong));
    return wrong.empty() && calls == 64 * 2 * 5 ? 0 : 1;
  });
  RankReport a = attacker.Reap(60);
  std::cerr << "attacker ran as " << a.message << "\n";
  EXPECT_EQ(a.exit_code, 0) << a.message;
  sh->attacked.store(1);
  for (size_t r = 0; r < ranks.size(); ++r) {
    RankReport rep = ranks[r]->Reap(60);
    EXPECT_EQ(rep.exit_code, 0) << "rank " << r << ": " << rep.message;
  }
  FreeSharedPage(sh);
}

}  // namespace
}  // namespace dmagather::testing

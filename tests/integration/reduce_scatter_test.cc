// Reduce-scatter and all-to-all through a real dmagatherd and real rank
// processes (host backend), bit-exact against the reference reduction
// (tests/support/reduce_reference.h, written apart from common/reduce):
// every dtype and op, 1 element to past the staging bound (moved in
// slices), 2..8 ranks, in place and out of place, mixed with all-gathers;
// and what is refused, on every rank.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dmagather/client.h"
#include "tests/integration/harness.h"
#include "tests/integration/rank_checks.h"
#include "tests/support/reduce_reference.h"

namespace dmagather::testing {
namespace {

using support::ReduceScatterExpected;
using support::ReduceScatterInput;

class ReduceScatterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = DaemonProcess::Start();
    ASSERT_NE(daemon_, nullptr);
  }
  void TearDown() override { unsetenv("DMAGATHER_STAGING_MB"); }
  std::unique_ptr<DaemonProcess> daemon_;
};

// One reduce-scatter case in one rank: "" or what went wrong.
std::string RunCase(Comm& comm, char* send, char* recv, uint32_t dtype, int redop, uint64_t count, uint64_t seed,
                    bool in_place) {
  const int rank = comm.rank(), world = comm.size();
  const size_t size = common::DtypeSize(dtype);
  const std::vector<unsigned char> mine = ReduceScatterInput(rank, world, dtype, count, seed);
  if (!mine.empty()) std::memcpy(send, mine.data(), mine.size());
  char* out = in_place ? send + uint64_t(rank) * count * size : recv;
  const auto st = comm.ReduceScatter(send, out, count, static_cast<dmagather_dtype_t>(dtype),
                                     static_cast<dmagather_redop_t>(redop));
  const std::string what = absl::StrCat(common::DtypeName(dtype), redop == 1 ? " avg" : " sum", " count=", count,
                                        in_place ? " in place" : "", ": ");
  if (st != DMAGATHER_OK) return what + comm.error();
  const std::vector<unsigned char> want = ReduceScatterExpected(rank, world, dtype, redop, count, seed);
  for (uint64_t i = 0; i < count; ++i) {
    if (std::memcmp(out + i * size, want.data() + i * size, size) != 0) {
      return absl::StrCat(what, "element ", i, " differs from the reference");
    }
  }
  return "";
}

// Runs fn in every rank of a `world`-rank job with a send and a recv buffer
// of `bytes` each; fails the test with the ranks' messages.
void RunJob(const std::string& socket, int world, size_t bytes,
            const std::function<std::string(Comm&, char*, char*)>& fn) {
  const std::string job = UniqueJob("rs");
  auto reports = RunRanks(world, [&](int rank, const Reporter& rep) {
    Comm comm(socket.c_str(), job, world, rank);
    if (!comm.ok()) {
      rep.Say("init: " + comm.error());
      return 2;
    }
    char* send = static_cast<char*>(comm.Alloc(bytes));
    char* recv = static_cast<char*>(comm.Alloc(bytes));
    if (send == nullptr || recv == nullptr) {
      rep.Say("alloc: " + comm.error());
      return 3;
    }
    const std::string why = fn(comm, send, recv);
    rep.Say(why);
    return why.empty() ? 0 : 1;
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(reports[r].exit_code, 0) << "rank " << r << ": " << reports[r].message;
  }
}

std::vector<int> Redops(uint32_t dtype) {
  return dtype >= common::kDtypeFloat16 ? std::vector<int>{0, 1} : std::vector<int>{0};
}

TEST_F(ReduceScatterTest, EveryDtypeAndOpBitExactInPlaceAndOut) {
  for (int world : {2, 3}) {
    RunJob(daemon_->socket(), world, 8 * 3 * 5000 + 64, [](Comm& comm, char* send, char* recv) -> std::string {
      uint64_t seed = 1;
      for (uint32_t dtype = 0; dtype < common::kNumDtypes; ++dtype) {
        for (int redop : Redops(dtype)) {
          for (uint64_t count : {1ull, 3ull, 4097ull}) {
            for (bool in_place : {false, true}) {
              std::string why = RunCase(comm, send, recv, dtype, redop, count, ++seed, in_place);
              if (!why.empty()) return why;
            }
          }
        }
      }
      return "";
    });
  }
}

TEST_F(ReduceScatterTest, EightRanksAndOneRank) {
  for (int world : {8, 1}) {
    RunJob(daemon_->socket(), world, 4 * 8 * 1000, [](Comm& comm, char* send, char* recv) -> std::string {
      std::string why = RunCase(comm, send, recv, common::kDtypeBfloat16, 0, 1000, 7, false);
      if (why.empty()) why = RunCase(comm, send, recv, common::kDtypeFloat32, 1, 999, 8, true);
      return why;
    });
  }
}

TEST_F(ReduceScatterTest, OpsPastTheStagingBoundMoveInSlicesBitExact) {
  // 2 MiB of staging: halves of 1 MiB. 4 ranks x 300k bf16 = 2.3 MiB per op.
  setenv("DMAGATHER_STAGING_MB", "2", 1);
  constexpr uint64_t kCount = 300000;
  RunJob(daemon_->socket(), 4, 4 * kCount * 4, [](Comm& comm, char* send, char* recv) -> std::string {
    const uint64_t count = kCount;
    std::string why = RunCase(comm, send, recv, common::kDtypeBfloat16, 0, count, 21, false);
    if (why.empty()) why = RunCase(comm, send, recv, common::kDtypeFloat32, 1, count, 22, true);
    if (!why.empty()) return why;
    // The slices are ops of their own: 1 MiB halves hold 131072 bf16 of
    // each of 4 ranks' chunks, so the first op took 3 slices and the
    // second (fp32) 5.
    dmagather_op_t op = 0;
    if (dmagather_submit_fallback(comm.get(), "probe", &op) != DMAGATHER_FALLBACK) return "probe not refused";
    if (op != 3 + 5 + 1) return absl::StrCat("the ops took ", op - 1, " sequence numbers, expected 8 (3 + 5 slices)");
    return "";
  });
}

TEST_F(ReduceScatterTest, AsyncReduceScattersMixWithAllGathers) {
  RunJob(daemon_->socket(), 3, 3 * 2048 * 4 + 64, [](Comm& comm, char* send, char*) -> std::string {
    const int rank = comm.rank();
    const uint64_t count = 2048;
    const size_t size = 4;
    // Two async reduce-scatters of one send, an all-gather between them,
    // then the waits in reverse order.
    std::vector<unsigned char> a = ReduceScatterInput(rank, 3, common::kDtypeFloat32, count, 31);
    std::memcpy(send, a.data(), a.size());
    char* o1 = static_cast<char*>(comm.Alloc(count * size));
    char* o2 = static_cast<char*>(comm.Alloc(count * size));
    char* ag = static_cast<char*>(comm.Alloc(3 * 64));
    if (o1 == nullptr || o2 == nullptr || ag == nullptr) return "alloc: " + comm.error();
    dmagather_op_t h1 = 0, h2 = 0, h3 = 0;
    if (dmagather_reduce_scatter_async(comm.get(), send, o1, count, DMAGATHER_FLOAT32, DMAGATHER_SUM, nullptr, &h1) !=
        DMAGATHER_OK) {
      return "rs 1: " + comm.error();
    }
    std::memset(ag + rank * 64, rank + 1, 64);
    if (dmagather_allgather_async(comm.get(), ag + rank * 64, ag, 64, DMAGATHER_UINT8, nullptr, &h2) != DMAGATHER_OK) {
      return "ag: " + comm.error();
    }
    if (dmagather_reduce_scatter_async(comm.get(), send, o2, count, DMAGATHER_FLOAT32, DMAGATHER_AVG, nullptr, &h3) !=
        DMAGATHER_OK) {
      return "rs 2: " + comm.error();
    }
    if (dmagather_op_wait(comm.get(), h3) != DMAGATHER_OK) return "wait 3: " + comm.error();
    if (dmagather_op_wait(comm.get(), h2) != DMAGATHER_OK) return "wait 2: " + comm.error();
    int done = 0;
    if (dmagather_op_test(comm.get(), h1, &done) != DMAGATHER_OK || done != 1) return "test 1: " + comm.error();
    const std::vector<unsigned char> sum = ReduceScatterExpected(rank, 3, common::kDtypeFloat32, 0, count, 31);
    const std::vector<unsigned char> avg = ReduceScatterExpected(rank, 3, common::kDtypeFloat32, 1, count, 31);
    if (std::memcmp(o1, sum.data(), count * size) != 0) return "async sum differs from the reference";
    if (std::memcmp(o2, avg.data(), count * size) != 0) return "async avg differs from the reference";
    for (int r = 0; r < 3; ++r) {
      for (int i = 0; i < 64; ++i) {
        if (ag[r * 64 + i] != char(r + 1)) return "the all-gather between them differs";
      }
    }
    return "";
  });
}

TEST_F(ReduceScatterTest, AllToAllMovesEveryChunkBitExact) {
  RunJob(daemon_->socket(), 4, 4 * 777 * 8, [](Comm& comm, char* send, char* recv) -> std::string {
    const int rank = comm.rank();
    const uint64_t count = 777;
    const std::vector<unsigned char> mine = ReduceScatterInput(rank, 4, common::kDtypeInt64, count, 41);
    std::memcpy(send, mine.data(), mine.size());
    if (comm.AllToAll(send, recv, count, DMAGATHER_INT64) != DMAGATHER_OK) return "alltoall: " + comm.error();
    for (int s = 0; s < 4; ++s) {
      const std::vector<unsigned char> theirs = ReduceScatterInput(s, 4, common::kDtypeInt64, count, 41);
      if (std::memcmp(recv + s * count * 8, theirs.data() + rank * count * 8, count * 8) != 0) {
        return absl::StrCat("chunk from rank ", s, " differs");
      }
    }
    // Out of place only.
    if (comm.AllToAll(send, send + 8, count, DMAGATHER_INT64) != DMAGATHER_INVALID_ARGUMENT) {
      return "an overlapping all-to-all was not refused";
    }
    return Contains(comm.error(), "overlap") ? "" : "the refusal does not say why: " + comm.error();
  });
}

// Every rank gets `code` and a message with `what` for a bad op, and the
// job goes on: the next reduce-scatter is bit-exact.
void ExpectRefusedEverywhere(const std::string& socket, int world, dmagather_status_t code, const std::string& what,
                             const std::function<dmagather_status_t(Comm&, char*, char*)>& bad) {
  RunJob(socket, world, 4 * 4 * 256, [&](Comm& comm, char* send, char* recv) -> std::string {
    const dmagather_status_t st = bad(comm, send, recv);
    if (st != code) return absl::StrCat("status ", st, " (", comm.error(), "), expected ", code);
    if (!Contains(comm.error(), what)) return "the message does not say '" + what + "': " + comm.error();
    return RunCase(comm, send, recv, common::kDtypeFloat32, 0, 256, 51, false);
  });
}

TEST_F(ReduceScatterTest, AverageOfIntegersIsRefusedOnEveryRank) {
  ExpectRefusedEverywhere(daemon_->socket(), 3, DMAGATHER_INVALID_ARGUMENT, "AVG is not defined",
                          [](Comm& comm, char* send, char* recv) {
                            return comm.ReduceScatter(send, recv, 16, DMAGATHER_INT32, DMAGATHER_AVG);
                          });
}

TEST_F(ReduceScatterTest, RanksThatDisagreeAreToldOnEveryRank) {
  ExpectRefusedEverywhere(daemon_->socket(), 3, DMAGATHER_INVALID_ARGUMENT, "ranks disagree",
                          [](Comm& comm, char* send, char* recv) {
                            // Rank 2 asks for a different size; rank 1 for a different dtype.
                            const size_t count = comm.rank() == 2 ? 17 : 16;
                            const auto dtype = comm.rank() == 1 ? DMAGATHER_FLOAT16 : DMAGATHER_FLOAT32;
                            return comm.ReduceScatter(send, recv, count, dtype, DMAGATHER_SUM);
                          });
}

TEST_F(ReduceScatterTest, ARankThatCannotTakePartFailsTheOpEverywhere) {
  // Rank 0's output overlaps its send without being its own chunk.
  ExpectRefusedEverywhere(daemon_->socket(), 2, DMAGATHER_INVALID_ARGUMENT, "rank 0",
                          [](Comm& comm, char* send, char* recv) {
                            char* out = comm.rank() == 0 ? send + 4 : recv;
                            return comm.ReduceScatter(send, out, 16, DMAGATHER_FLOAT32, DMAGATHER_SUM);
                          });
}

TEST_F(ReduceScatterTest, ARankKilledMidReduceScatterFailsThePeersAndTheDaemonServesOn) {
  const std::string job = UniqueJob("rskill");
  const std::string socket = daemon_->socket();
  auto reports = RunRanks(3, [&](int rank, const Reporter& rep) {
    Comm comm(socket.c_str(), job, 3, rank);
    if (!comm.ok()) return rep.Say(comm.error()), 2;
    char* send = static_cast<char*>(comm.Alloc(3 * 4096 * 4));
    char* recv = static_cast<char*>(comm.Alloc(4096 * 4));
    if (send == nullptr || recv == nullptr) return rep.Say(comm.error()), 3;
    std::string why = RunCase(comm, send, recv, common::kDtypeFloat32, 0, 4096, 61, false);
    if (!why.empty()) return rep.Say(why), 1;
    if (rank == 2) {  // Dies while ranks 0 and 1 wait for it in the next reduce-scatter.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      raise(SIGKILL);
    }
    const dmagather_status_t st = comm.ReduceScatter(send, recv, 4096, DMAGATHER_FLOAT32, DMAGATHER_SUM);
    *rep.status = st;
    rep.Say(comm.error());
    return st == DMAGATHER_PEER_FAILED ? 0 : 5;
  });
  EXPECT_EQ(reports[2].exit_code, 128 + SIGKILL);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(reports[r].exit_code, 0) << reports[r].message;
    EXPECT_NE(reports[r].message.find("rank 2"), std::string::npos) << reports[r].message;
  }
  // The daemon serves a new job, bit-exact.
  RunJob(socket, 2, 2 * 512 * 4, [](Comm& comm, char* send, char* recv) {
    return RunCase(comm, send, recv, common::kDtypeBfloat16, 1, 512, 62, false);
  });
}

TEST_F(ReduceScatterTest, TwoJobsAtOnceEachMixingReduceScattersAndAllGathers) {
  const std::string socket = daemon_->socket();
  const std::string jobs[2] = {UniqueJob("mixa"), UniqueJob("mixb")};
  // Processes 0-2 are job A's ranks, 3-4 job B's; each alternates the two ops.
  auto reports = RunRanks(5, [&](int p, const Reporter& rep) {
    const int job = p < 3 ? 0 : 1, world = job == 0 ? 3 : 2, rank = job == 0 ? p : p - 3;
    Comm comm(socket.c_str(), jobs[job], world, rank);
    if (!comm.ok()) return rep.Say(comm.error()), 2;
    const uint64_t count = 20000 + 1000 * job;
    char* send = static_cast<char*>(comm.Alloc(world * count * 4));
    char* recv = static_cast<char*>(comm.Alloc(world * count * 4));
    if (send == nullptr || recv == nullptr) return rep.Say(comm.error()), 3;
    for (int i = 0; i < 6; ++i) {
      std::string why = RunCase(comm, send, recv, common::kDtypeBfloat16, i % 2, count, 70 + i + 10 * job, false);
      if (why.empty()) {
        std::memset(send, rank + 1 + i, count);
        if (comm.AllGather(send, recv, count, DMAGATHER_UINT8) != DMAGATHER_OK || comm.Wait() != DMAGATHER_OK) {
          why = "allgather: " + comm.error();
        }
        for (int r = 0; why.empty() && r < world; ++r) {
          for (uint64_t k = 0; k < count; ++k) {
            if (recv[r * count + k] != char(r + 1 + i)) {
              why = absl::StrCat("allgather ", i, ": rank ", r, "'s shard differs");
              break;
            }
          }
        }
      }
      if (!why.empty()) return rep.Say(why), 1;
    }
    return 0;
  });
  for (int p = 0; p < 5; ++p) EXPECT_EQ(reports[p].exit_code, 0) << "process " << p << ": " << reports[p].message;
}

}  // namespace
}  // namespace dmagather::testing

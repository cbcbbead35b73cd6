// Bit-exact AllGather through a real dmagatherd and real rank processes:
// every dtype at 1, 3, 4095, 1 MiB+7 elements and a 64 MiB shard; out of
// place, in place, list output, odd offsets inside one allocation; several
// jobs at once.
#include <gtest/gtest.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "dmagather/client.h"
#include "tests/integration/harness.h"
#include "tests/support/verify.h"

namespace dmagather::testing {
namespace {

using support::CheckAllGather;
using support::Variant;

class AllGatherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = DaemonProcess::Start();
    ASSERT_NE(daemon_, nullptr);
  }
  std::unique_ptr<DaemonProcess> daemon_;
};

// Runs `checks` in every rank of a `world`-rank job; fails the test with the
// ranks' messages.
void RunChecks(const std::string& socket, int world, size_t max_shard_bytes,
               const std::function<bool(Comm&, char*, char*, std::vector<char>*, std::string*)>& checks) {
  const std::string job = UniqueJob("ag");
  auto reports = RunRanks(world, [&](int rank, const Reporter& rep) {
    Comm comm(socket.c_str(), job, world, rank);
    if (!comm.ok()) {
      rep.Say("init: " + comm.error());
      return 2;
    }
    char* send = static_cast<char*>(comm.Alloc(max_shard_bytes + 8192));
    char* recv = static_cast<char*>(comm.Alloc(max_shard_bytes * world + 8192));
    if (send == nullptr || recv == nullptr) {
      rep.Say("alloc: " + comm.error());
      return 3;
    }
    std::vector<char> scratch;
    std::string why;
    if (!checks(comm, send, recv, &scratch, &why)) {
      rep.Say(why);
      return 1;
    }
    return 0;
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(reports[r].exit_code, 0) << "rank " << r << ": " << reports[r].message;
  }
}

TEST_F(AllGatherTest, EveryDtypeOddSizesAllVariantsBitExact) {
  const size_t counts[] = {1, 3, 4095, (1u << 20) + 7};
  RunChecks(daemon_->socket(), 4, ((1u << 20) + 7) * 8, [&](Comm& comm, char* s, char* r, auto* scratch, auto* why) {
    uint64_t seed = 100;
    for (int d = 0; d < DMAGATHER_NUM_DTYPES; ++d) {
      for (size_t count : counts) {
        for (Variant v : support::kAllVariants) {
          if (!CheckAllGather(comm, s, r, static_cast<dmagather_dtype_t>(d), count, v, ++seed, scratch, why)) {
            return false;
          }
        }
      }
    }
    return true;
  });
}

TEST_F(AllGatherTest, SixtyFourMiBShardsEveryDtype) {
  const size_t shard = 64u << 20;
  RunChecks(daemon_->socket(), 4, shard, [&](Comm& comm, char* s, char* r, auto* scratch, auto* why) {
    for (int d = 0; d < DMAGATHER_NUM_DTYPES; ++d) {
      auto dt = static_cast<dmagather_dtype_t>(d);
      Variant v = d % 2 == 0 ? Variant::kOutOfPlace : Variant::kInPlace;
      if (!CheckAllGather(comm, s, r, dt, shard / dmagather_dtype_size(dt), v, 7000 + d, scratch, why)) return false;
    }
    return true;
  });
}

TEST_F(AllGatherTest, SingleRankJobCopiesItsShard) {
  RunChecks(daemon_->socket(), 1, 4096 * 4, [&](Comm& comm, char* s, char* r, auto* scratch, auto* why) {
    return CheckAllGather(comm, s, r, DMAGATHER_FLOAT32, 4096, Variant::kOutOfPlace, 5, scratch, why) &&
           CheckAllGather(comm, s, r, DMAGATHER_FLOAT32, 4096, Variant::kInPlace, 6, scratch, why);
  });
}

TEST_F(AllGatherTest, ManyOpsInFlightBeforeWait) {
  // 300 ops submitted back to back (more than the 256-slot ring) before one
  // wait: back-pressure, in-order completion, and every output checked.
  const int world = 3, ops = 300;
  const size_t count = 1000;
  const std::string job = UniqueJob("burst");
  auto reports = RunRanks(world, [&](int rank, const Reporter& rep) {
    Comm comm(daemon_->socket().c_str(), job, world, rank);
    if (!comm.ok()) {
      rep.Say(comm.error());
      return 2;
    }
    const size_t shard = count * 4;
    char* recv = static_cast<char*>(comm.Alloc(shard * world * ops));
    for (int i = 0; i < ops; ++i) {
      char* out = recv + size_t(i) * shard * world;
      support::FillPattern(out + rank * shard, shard, 900 + i, rank);
      if (comm.AllGather(out + rank * shard, out, count, DMAGATHER_INT32) != DMAGATHER_OK) {
        rep.Say(comm.error());
        return 1;
      }
    }
    if (comm.Wait() != DMAGATHER_OK) {
      rep.Say(comm.error());
      return 1;
    }
    std::vector<char> expect(shard);
    for (int i = 0; i < ops; ++i) {
      for (int r = 0; r < world; ++r) {
        support::FillPattern(expect.data(), shard, 900 + i, r);
        if (std::memcmp(recv + (size_t(i) * world + r) * shard, expect.data(), shard) != 0) {
          rep.Say(absl::StrCat("op ", i, " shard ", r, " differs"));
          return 1;
        }
      }
    }
    return 0;
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(reports[r].exit_code, 0) << reports[r].message;
}

TEST_F(AllGatherTest, BufferCanBeFreedRightAfterWait) {
  // The daemon counts an op out of a buffer before the client can see it
  // done, so free() after wait() never finds the buffer busy.
  const std::string job = UniqueJob("free");
  auto reports = RunRanks(2, [&](int rank, const Reporter& rep) {
    Comm comm(daemon_->socket().c_str(), job, 2, rank);
    if (!comm.ok()) return rep.Say(comm.error()), 2;
    for (int i = 0; i < 200; ++i) {
      char* buf = static_cast<char*>(comm.Alloc(8192));
      if (buf == nullptr) return rep.Say(comm.error()), 1;
      if (comm.AllGather(buf + rank * 4096, buf, 4096, DMAGATHER_UINT8) != DMAGATHER_OK ||
          comm.Wait() != DMAGATHER_OK || comm.Free(buf) != DMAGATHER_OK) {
        return rep.Say(absl::StrCat("iteration ", i, ": ", comm.error())), 1;
      }
    }
    return 0;
  });
  for (const auto& r : reports) EXPECT_EQ(r.exit_code, 0) << r.message;
}

TEST_F(AllGatherTest, FourJobsOfFourRanksAtOnce) {
  const int jobs = 4, world = 4;
  std::vector<std::unique_ptr<RankProcess>> procs;
  std::vector<std::string> keys;
  for (int j = 0; j < jobs; ++j) keys.push_back(UniqueJob("multi"));
  for (int j = 0; j < jobs; ++j) {
    for (int r = 0; r < world; ++r) {
      procs.push_back(std::make_unique<RankProcess>(r, [&, j](int rank, const Reporter& rep) {
        Comm comm(daemon_->socket().c_str(), keys[j], world, rank);
        if (!comm.ok()) {
          rep.Say(comm.error());
          return 2;
        }
        const size_t count = 65536 + j;  // Each job its own size.
        char* s = static_cast<char*>(comm.Alloc(count * 8 + 8192));
        char* rb = static_cast<char*>(comm.Alloc(count * 8 * world + 8192));
        std::vector<char> scratch;
        std::string why;
        for (int it = 0; it < 20; ++it) {
          auto dt = static_cast<dmagather_dtype_t>(it % DMAGATHER_NUM_DTYPES);
          Variant v = support::kAllVariants[it % 4];
          if (!CheckAllGather(comm, s, rb, dt, count, v, 1000 * j + it, &scratch, &why)) {
            rep.Say(absl::StrCat("job ", j, ": ", why));
            return 1;
          }
        }
        return 0;
      }));
    }
  }
  for (size_t i = 0; i < procs.size(); ++i) {
    RankReport rep = procs[i]->Reap(120);
    EXPECT_EQ(rep.exit_code, 0) << "job " << i / world << " rank " << i % world << ": " << rep.message;
  }
}

}  // namespace
}  // namespace dmagather::testing

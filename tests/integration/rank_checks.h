// Helpers shared by the integration tests whose rank processes report
// through a Reporter (harness.h): REQUIRE, pages shared across fork, a
// polling wait, the bit-exact AllGather output check, and a whole job that
// must run bit-exact.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dmagather/client.h"
#include "tests/integration/harness.h"
#include "tests/support/verify.h"

namespace dmagather::testing {

// In a rank function (with `rep` a Reporter): fails the rank with a
// message naming the line.
#define REQUIRE(cond, msg)                                                \
  do {                                                                    \
    if (!(cond)) {                                                        \
      rep.Say(absl::StrCat("line ", __LINE__, ": ", #cond, ": ", (msg))); \
      return 1;                                                           \
    }                                                                     \
  } while (0)

// A T in memory shared with the processes forked after this call.
template <typename T>
T* SharedPage() {
  void* p = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return new (p) T();
}

template <typename T>
void FreeSharedPage(T* p) {
  p->~T();
  munmap(p, sizeof(T));
}

// Polls (sleeping 1 ms) until pred() or `seconds` pass; returns pred().
template <typename Pred>
bool WaitFor(Pred pred, double seconds = 30) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// First byte offset where the output of an AllGather of `shard` bytes per
// rank (rank r's shard = FillPattern(seed, r)) differs, or -1.
inline long FirstMismatch(const char* out, size_t shard, int world, uint64_t seed) {
  std::vector<char> want(shard);
  for (int r = 0; r < world; ++r) {
    support::FillPattern(want.data(), shard, seed, r);
    if (std::memcmp(out + r * shard, want.data(), shard) == 0) continue;
    for (size_t i = 0; i < shard; ++i) {
      if (out[r * shard + i] != want[i]) return long(r * shard + i);
    }
  }
  return -1;
}

// One AllGather of `count` floats per rank, checked bit-exact; "" when right.
inline std::string RunOp(Comm& comm, char* send, char* recv, size_t count, int world, int rank, uint64_t seed) {
  const size_t shard = count * 4;
  std::memset(recv, 0xEE, shard * world);
  support::FillPattern(send, shard, seed, rank);
  dmagather_status_t st = comm.AllGather(send, recv, count, DMAGATHER_FLOAT32);
  if (st == DMAGATHER_OK) st = comm.Wait();
  if (st != DMAGATHER_OK) return absl::StrCat("allgather: ", dmagather_status_string(st), " ", comm.error());
  const long bad = FirstMismatch(recv, shard, world, seed);
  return bad < 0 ? "" : absl::StrCat("output differs at byte ", bad);
}

// One rank of a job of `world` ranks running `ops` AllGathers bit-exact.
inline std::function<int(int, const Reporter&)> BitExactRank(const std::string& socket, const std::string& job,
                                                             int world, int ops) {
  return [=](int rank, const Reporter& rep) {
    Comm comm(socket.c_str(), job, world, rank);
    REQUIRE(comm.ok(), comm.error());
    const size_t count = 40000;
    char* send = static_cast<char*>(comm.Alloc(count * 4));
    char* recv = static_cast<char*>(comm.Alloc(count * 4 * world));
    REQUIRE(send != nullptr && recv != nullptr, comm.error());
    for (int i = 0; i < ops; ++i) {
      std::string why = RunOp(comm, send, recv, count, world, rank, 1000 + i);
      REQUIRE(why.empty(), why);
    }
    return 0;
  };
}

// Checks the ranks' reports of a bit-exact job; where the harness had to kill
// a rank, prints where the job stood in the daemon.
inline void ExpectReportsOk(const std::string& socket, const std::string& job, const std::vector<RankReport>& reports) {
  bool killed = false;
  for (size_t r = 0; r < reports.size(); ++r) {
    EXPECT_EQ(reports[r].exit_code, 0) << job << " rank " << r << ": " << reports[r].message;
    killed |= reports[r].exit_code == 128 + SIGKILL;  // Timed out and killed by the harness.
  }
  if (killed && access("tools/dmagatherctl", X_OK) == 0) {  // Where the job stood, for the failure's reader.
    int rc = 0;
    std::cerr << "dmagatherctl stats " << job << ":\n"
              << RunProgram({"tools/dmagatherctl", "--socket=" + socket, "--job=" + job, "stats"}, &rc) << "\n";
  }
}

// A whole job of `world` ranks (this uid) running `ops` AllGathers bit-exact.
// Forks: call it from a process with one thread (a child of a multi-threaded
// process may inherit a lock another thread held, e.g. the allocator's).
inline void ExpectJobBitExact(const std::string& socket, const std::string& job, int world = 2, int ops = 5) {
  ExpectReportsOk(socket, job, RunRanks(world, BitExactRank(socket, job, world, ops)));
}

}  // namespace dmagather::testing

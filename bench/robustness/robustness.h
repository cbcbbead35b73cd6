// Robustness driver: puts a real dmagatherd through what the robustness table
// of docs/OPERATIONS.md claims, and prints that table from its own runs.
//
//   robustness --dmagatherd=PATH --dmagatherctl=PATH --runs=mutate,kill,restart,soak
//
// Runs (each with its own numbers, all scaled by flags):
//  mutate   one 2-rank job whose rank 0 writes mutated v1/v2 descriptors
//           straight into its request ring (random fields and bit flips on a
//           valid descriptor: stamp, op, seq, dtype, count, items_following,
//           region ids, offsets, num_recv, refusal text), while rank 1 submits
//           the valid op each time and a concurrent good job checks every
//           AllGather bit-exact. Counted: daemon crashes, hangs (an op that
//           neither completes nor fails within the op timeout), cross-rank
//           disagreement (rank 0's status of op N from its own completion
//           block vs rank 1's dmagather_op_wait), bad bytes in the good job,
//           bytes changed in a never-used buffer of rank 1.
//  kill     N times: a 3-rank job running ops, one rank SIGKILLed at a random
//           moment; the survivors must get PEER_FAILED; kill -> error latency.
//  restart  N cycles: SIGKILL the daemon while a job runs (its ranks must get
//           UNAVAILABLE, not hang), restart it on the same socket path, check
//           that no stale files remain, run a new job bit-exact.
//  soak     J jobs x R ranks for S seconds, random shard sizes, every result
//           checked; ops, bytes, corrupt bytes, daemon RSS and threads.
//
// Process model: this parent process never touches gRPC or the client
// library; every rank is a forked child (as in tests/integration/harness.cc),
// so forking stays safe. Results come back through MAP_SHARED memory.
//
// Why rank 0 of the mutate job writes its ring itself instead of
// CommImpl::SubmitRawForTesting: that call sets `seq` and counts every
// descriptor as one op, so mutated seq and items_following (a v2 descriptor
// that announces more items of its op) cannot be expressed through it. The
// driver finds its rank's segment and the doorbell among its own mappings
// (/proc/self/maps: "/memfd:dmagather-seg", "/memfd:dmagather-doorbell"),
// takes the descriptor of a first, valid op from the ring as the template,
// and from then on publishes into the ring, bumps ready_seq and reads done_seq
// and the error records the way libdmagather does; it sends the extra
// descriptors the daemon will read as items of an op whose first descriptor
//
// The driver in pieces: this header (the flags, the helpers, the daemon under
// test, the table, a good job's rank; common.cc and good_job.cc behind it),
// one file per run (mutate.cc, kill.cc, restart.cc, soak.cc), each adding its
// row to the table, and main.cc, which runs them in order.
#pragma once

#include <sys/mman.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "dmagather/client.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/verify.h"

ABSL_DECLARE_FLAG(std::string, dmagatherd);
ABSL_DECLARE_FLAG(std::string, dmagatherctl);
ABSL_DECLARE_FLAG(std::string, runs);
ABSL_DECLARE_FLAG(std::string, dir);
ABSL_DECLARE_FLAG(int, op_timeout_s);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(int, mutations);
ABSL_DECLARE_FLAG(int, window);
ABSL_DECLARE_FLAG(int, good_ranks);
ABSL_DECLARE_FLAG(int, kills);
ABSL_DECLARE_FLAG(int, kill_world);
ABSL_DECLARE_FLAG(int, restarts);
ABSL_DECLARE_FLAG(int, restart_delay_ms);
ABSL_DECLARE_FLAG(int, soak_jobs);
ABSL_DECLARE_FLAG(int, soak_ranks);
ABSL_DECLARE_FLAG(int, soak_s);
ABSL_DECLARE_FLAG(int, soak_min_kib);
ABSL_DECLARE_FLAG(int, soak_max_kib);

namespace dmagather::bench::robustness {

using dmagather::Comm;
using dmagather::common::MonotonicNs;
using dmagather::support::FillPattern;
using dmagather::support::SplitMix64;

// ---------------------------------------------------------------- helpers.

template <typename T>
T* SharedArray(size_t n) {
  void* p = mmap(nullptr, sizeof(T) * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  for (size_t i = 0; i < n; ++i) new (static_cast<T*>(p) + i) T();
  return static_cast<T*>(p);
}

inline double Seconds(uint64_t from_ns, uint64_t to_ns) { return (to_ns - from_ns) / 1e9; }

// Runs fn() in a forked child; its return value is the child's exit code.
pid_t Spawn(const std::function<int()>& fn);

// Waits for `pid` at most timeout_s; kills it after that. Returns the exit
// code (128+signal when killed), and *timed_out.
int Reap(pid_t pid, double timeout_s, bool* timed_out = nullptr);

std::vector<std::string> DirEntries(const std::string& dir, const std::string& contains = "");

std::string Join(const std::vector<std::string>& v);

struct ProcStats {
  long rss_kib = -1, anon_kib = -1, threads = -1, fds = -1;
  std::string Str() const {
    return absl::StrFormat("RSS %.1f MiB (anon %.1f MiB), %d threads, %d fds", rss_kib / 1024.0, anon_kib / 1024.0,
                           int(threads), int(fds));
  }
};

ProcStats ReadProc(pid_t pid);

// ---------------------------------------------------------------- daemon.

// The daemon under test (tests/integration/daemon_process.h), started again
// on the same socket by the restart run; its health through dmagatherctl.
class Daemon {
 public:
  Daemon(std::string dir, std::vector<std::string> flags) : dir_(std::move(dir)), flags_(std::move(flags)) {}
  std::string socket() const { return dir_ + "/dmagatherd.sock"; }
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return proc_ != nullptr ? proc_->pid() : -1; }

  bool Start() {
    dmagather::testing::DaemonStart start;
    start.binary = absl::GetFlag(FLAGS_dmagatherd);
    start.flags = {absl::StrCat("--op_timeout_s=", absl::GetFlag(FLAGS_op_timeout_s))};
    start.flags.insert(start.flags.end(), flags_.begin(), flags_.end());
    start.dir = dir_;
    start.listen_timeout_s = 10;
    proc_ = dmagather::testing::DaemonProcess::StartWith(start);
    if (proc_ == nullptr) return false;
    proc_->KeepDir();  // Its log stays, and the next start uses the same socket.
    return true;
  }
  // Alive: not reaped and not a zombie.
  bool Alive() { return proc_ != nullptr && proc_->Alive(); }
  int Stop(int sig) { return proc_ != nullptr ? proc_->Stop(sig) : -1; }
  // `dmagatherctl health`: true when it says SERVING (exit 0).
  bool Healthy(std::string* out = nullptr) {
    int p[2];
    if (pipe(p) != 0) return false;
    fflush(stdout);
    pid_t c = fork();
    if (c == 0) {
      dup2(p[1], 1);
      dup2(p[1], 2);
      close(p[0]);
      std::string a0 = absl::GetFlag(FLAGS_dmagatherctl), a1 = "--socket=" + socket(), a2 = "health";
      char* argv[] = {a0.data(), a1.data(), a2.data(), nullptr};
      execv(argv[0], argv);
      _exit(127);
    }
    close(p[1]);
    std::string text;
    char buf[512];
    ssize_t n;
    while ((n = read(p[0], buf, sizeof(buf))) > 0) text.append(buf, n);
    close(p[0]);
    const int rc = Reap(c, 30);
    if (out) *out = text;
    return rc == 0 && text.find("SERVING") != std::string::npos && text.find("NOT_SERVING") == std::string::npos;
  }

 private:
  std::string dir_;
  std::vector<std::string> flags_;
  std::unique_ptr<dmagather::testing::DaemonProcess> proc_;
};

// ---------------------------------------------------------------- table.

struct Row {
  std::string run, load, faults, bad_inputs, lost;
  bool ok = true;
  double seconds = 0;
};
extern std::vector<Row> g_rows;  // Each run adds its row.

void PrintTable();

// ------------------------------------------------------- a good job's rank.

// Shared by the ranks of one good job. Rank 0 alone decides where the job
// stops (stop_at = its next op + 1 once `stop` is set), so all ranks run the
// same ops.
struct GoodJob {
  std::atomic<int> stop{0};
  std::atomic<int64_t> stop_at{-1};
  std::atomic<uint64_t> ops{0};            // Ops completed (rank 0 counts).
  std::atomic<uint64_t> bytes_checked{0};  // Output bytes compared, all ranks.
  std::atomic<uint64_t> bad_bytes{0};
  std::atomic<uint64_t> failed_ops{0};  // Ops that did not return OK (any rank).
  std::atomic<uint64_t> progress{0};    // Any rank finished an op (watchdog).
  std::atomic<int> joined{0};
  // Rank 0: when op n was seen done and checked (by n % kDoneTimes).
  static constexpr int kDoneTimes = 4096;
  std::atomic<uint64_t> done_ns[kDoneTimes];
  char why[512];
  std::atomic<int> why_set{0};
  void Say(const std::string& s) {
    if (why_set.fetch_add(1) == 0) snprintf(why, sizeof(why), "%s", s.c_str());
  }
};

// Random ops (flat out-of-place, flat in place, list) of random dtype and
// shard size in [min_bytes, max_bytes] (log-uniform), every output checked
// byte by byte against the pattern. Returns the exit code.
int GoodRank(const std::string& socket, const std::string& job, int world, int rank, size_t min_bytes, size_t max_bytes,
             uint64_t seed, GoodJob* g);

// ------------------------------------------- a rank of a job that loses one.

// Shared by the ranks of one job of the kill run (and of the restart run's
// jobs, whose daemon dies).
struct KillShared {
  std::atomic<int> ready{0};
  std::atomic<uint64_t> error_ns[8];
  std::atomic<int> status[8];
  std::atomic<int> names_victim[8];
  std::atomic<uint64_t> ops_checked{0};
  std::atomic<uint64_t> bad{0};
  char why[512];
  std::atomic<int> why_set{0};
};

// Runs checked 16 KiB ops until one fails, then records when, its status
// and whether its message names `victim` in sh (kill.cc).
int KillRank(const std::string& socket, const std::string& job, int world, int rank, int victim, KillShared* sh);

// ------------------------------------------------------------------- runs.

// Each prints what it does and adds its row to g_rows.
void RunMutate(Daemon& daemon);
void RunKill(Daemon& daemon);
void RunRestart(const std::string& base);
void RunSoak(Daemon& daemon);

}  // namespace dmagather::bench::robustness

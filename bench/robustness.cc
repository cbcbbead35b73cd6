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
// announced them, so the daemon's and the driver's op numbering stay equal.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "abi/completion_v1.h"
#include "abi/descriptor_v2.h"
#include "abi/ring_v1.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/futex.h"
#include "dmagather/client.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/verify.h"

ABSL_FLAG(std::string, dmagatherd, "bazel-bin/server/dmagatherd", "The daemon binary.");
ABSL_FLAG(std::string, dmagatherctl, "bazel-bin/tools/dmagatherctl", "The CLI (health).");
ABSL_FLAG(std::string, runs, "mutate,kill,restart,soak", "Runs, in order.");
ABSL_FLAG(std::string, dir, "", "Socket directories go under here (default: a fresh /tmp dir).");
ABSL_FLAG(int, op_timeout_s, 5, "The daemon's --op_timeout_s (a hang = no answer within 2x this + 5 s).");
ABSL_FLAG(uint64_t, seed, 12, "Random seed.");
ABSL_FLAG(int, mutations, 100000, "mutate: mutated descriptors (ops) rank 0 submits.");
ABSL_FLAG(int, window, 8, "mutate: ops in flight per rank (<= 8: the error block keeps 16 records).");
ABSL_FLAG(int, good_ranks, 3, "mutate: ranks of the concurrent good job.");
ABSL_FLAG(int, kills, 200, "kill: rank SIGKILLs.");
ABSL_FLAG(int, kill_world, 3, "kill: ranks per job.");
ABSL_FLAG(int, restarts, 20, "restart: daemon SIGKILL + restart cycles.");
ABSL_FLAG(int, soak_jobs, 8, "soak: jobs.");
ABSL_FLAG(int, soak_ranks, 4, "soak: ranks per job.");
ABSL_FLAG(int, soak_s, 120, "soak: seconds.");
ABSL_FLAG(int, soak_min_kib, 4, "soak: smallest shard (KiB).");
ABSL_FLAG(int, soak_max_kib, 4096, "soak: largest shard (KiB).");

namespace {

using dmagather::Comm;
using dmagather::common::MonotonicNs;
using dmagather::support::FillPattern;
using dmagather::support::SplitMix64;
namespace abi = dmagather::abi;

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

double Seconds(uint64_t from_ns, uint64_t to_ns) { return (to_ns - from_ns) / 1e9; }

pid_t Spawn(const std::function<int()>& fn) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) _exit(fn());
  return pid;
}

// Waits for `pid` at most timeout_s; kills it after that. Returns the exit
// code (128+signal when killed), and *timed_out.
int Reap(pid_t pid, double timeout_s, bool* timed_out = nullptr) {
  const uint64_t deadline = MonotonicNs() + uint64_t(timeout_s * 1e9);
  int status = 0;
  if (timed_out) *timed_out = false;
  for (;;) {
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    if (MonotonicNs() > deadline) {
      if (timed_out) *timed_out = true;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    usleep(2000);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::vector<std::string> DirEntries(const std::string& dir, const std::string& contains = "") {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    if (!contains.empty() && n.find(contains) == std::string::npos) continue;
    out.push_back(n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) absl::StrAppend(&s, s.empty() ? "" : ",", x);
  return s.empty() ? "-" : s;
}

struct ProcStats {
  long rss_kib = -1, anon_kib = -1, threads = -1, fds = -1;
  std::string Str() const {
    return absl::StrFormat("RSS %.1f MiB (anon %.1f MiB), %d threads, %d fds", rss_kib / 1024.0, anon_kib / 1024.0,
                           int(threads), int(fds));
  }
};

ProcStats ReadProc(pid_t pid) {
  ProcStats s;
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    long v = 0;
    if (sscanf(line.c_str(), "VmRSS: %ld", &v) == 1) s.rss_kib = v;
    if (sscanf(line.c_str(), "RssAnon: %ld", &v) == 1) s.anon_kib = v;
    if (sscanf(line.c_str(), "Threads: %ld", &v) == 1) s.threads = v;
  }
  s.fds = long(DirEntries(absl::StrCat("/proc/", pid, "/fd")).size());
  return s;
}

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
std::vector<Row> g_rows;

void PrintTable() {
  printf("\n| run | load held | faults injected | bad inputs tried | what was lost | verdict | wall |\n");
  printf("|---|---|---|---|---|---|---|\n");
  for (const Row& r : g_rows) {
    printf("| %s | %s | %s | %s | %s | %s | %.1f s |\n", r.run.c_str(), r.load.c_str(), r.faults.c_str(),
           r.bad_inputs.c_str(), r.lost.c_str(), r.ok ? "held" : "**LOST**", r.seconds);
  }
  fflush(stdout);
}

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
             uint64_t seed, GoodJob* g) {
  Comm comm(socket.c_str(), job, world, rank);
  if (!comm.ok()) {
    g->Say(absl::StrCat("good job ", job, " rank ", rank, " init: ", comm.error()));
    return 2;
  }
  char* send = static_cast<char*>(comm.Alloc(max_bytes));
  char* recv = static_cast<char*>(comm.Alloc(max_bytes * world));
  if (send == nullptr || recv == nullptr) {
    g->Say(absl::StrCat("good job rank ", rank, " alloc: ", comm.error()));
    return 2;
  }
  g->joined.fetch_add(1);
  std::vector<char> want(max_bytes);
  static constexpr dmagather_dtype_t kTypes[] = {DMAGATHER_UINT8, DMAGATHER_FLOAT16, DMAGATHER_BFLOAT16,
                                                 DMAGATHER_FLOAT32, DMAGATHER_INT64};
  static constexpr size_t kSizes[] = {1, 2, 2, 4, 8};
  const double lmin = std::log2(double(min_bytes)), lmax = std::log2(double(max_bytes));
  for (int64_t op = 0;; ++op) {
    if (rank == 0 && g->stop.load() && g->stop_at.load() < 0) g->stop_at.store(op + 1);
    const int64_t stop_at = g->stop_at.load();
    if (stop_at >= 0 && op >= stop_at) break;
    uint64_t x = seed ^ (uint64_t(op) * 0x9e3779b97f4a7c15ull);
    const uint64_t r1 = SplitMix64(x), r2 = SplitMix64(x), r3 = SplitMix64(x);
    const int t = int(r1 % 5);
    const double l = lmin + (lmax - lmin) * double(r2 % 1000001) / 1e6;
    const size_t count = std::max<size_t>(1, size_t(std::exp2(l)) / kSizes[t]);
    const size_t shard = count * kSizes[t];
    const int variant = int(r3 % 3);  // 0 out of place, 1 in place, 2 list.
    const uint64_t pseed = seed * 1000003 + op;
    dmagather_status_t st;
    if (variant == 1) {
      FillPattern(recv + rank * shard, shard, pseed, rank);
      st = comm.AllGather(recv + rank * shard, recv, count, kTypes[t]);
    } else {
      FillPattern(send, shard, pseed, rank);
      if (variant == 0) {
        st = comm.AllGather(send, recv, count, kTypes[t]);
      } else {
        std::vector<void*> outs(world);
        for (int r = 0; r < world; ++r) outs[r] = recv + r * shard;
        st = comm.AllGatherList(send, outs, count, kTypes[t]);
      }
    }
    if (st == DMAGATHER_OK) st = comm.Wait();
    if (st != DMAGATHER_OK) {
      g->failed_ops.fetch_add(1);
      g->Say(absl::StrFormat("good job %s rank %d op %d: %s: %s", job, rank, op, dmagather_status_string(st),
                             comm.error()));
      return 1;
    }
    for (int r = 0; r < world; ++r) {
      FillPattern(want.data(), shard, pseed, r);
      const char* got = recv + r * shard;
      if (std::memcmp(got, want.data(), shard) != 0) {
        uint64_t bad = 0;
        for (size_t i = 0; i < shard; ++i) bad += got[i] != want[i];
        g->bad_bytes.fetch_add(bad);
        g->Say(absl::StrFormat("good job %s rank %d op %d: %u bad bytes in rank %d's shard", job, rank, op, bad, r));
      }
    }
    g->bytes_checked.fetch_add(shard * world);
    g->progress.fetch_add(1);
    if (rank == 0) g->ops.fetch_add(1);
  }
  return 0;
}

// ------------------------------------------------------------ run: mutate.

struct MutateShared {
  std::atomic<int> ready{0};             // Ranks past the template op.
  std::atomic<uint64_t> progress[2];     // Ops finished per rank (watchdog).
  std::atomic<uint64_t> descriptors{0};  // Ring slots rank 0 wrote (incl. announced extra items).
  std::atomic<uint64_t> hangs{0};
  std::atomic<uint64_t> records_lost{0};
  std::atomic<uint64_t> sentinel_bad{0};
  std::atomic<int> final_ok[2];
  std::atomic<uint64_t> field_hits[16];
  char why[512];
  std::atomic<int> why_set{0};
  void Say(const std::string& s) {
    if (why_set.fetch_add(1) == 0) snprintf(why, sizeof(why), "%s", s.c_str());
  }
};

constexpr int kNoStatus = 99;
constexpr size_t kMutShardBytes = 1024;
constexpr size_t kMutBufBytes = 1 << 16;

// The mapping of this process whose /proc/self/maps path contains `name`.
char* FindMapping(const char* name, size_t* bytes) {
  std::ifstream f("/proc/self/maps");
  std::string line;
  while (std::getline(f, line)) {
    if (line.find(name) == std::string::npos) continue;
    uintptr_t a = 0, b = 0;
    if (sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &a, &b) != 2) continue;
    *bytes = b - a;
    return reinterpret_cast<char*>(a);
  }
  return nullptr;
}

enum Field {
  kStamp,
  kOp,
  kSeq,
  kDtype,
  kCount,
  kItems,
  kSendRegion,
  kSendOffset,
  kRecvRegion,
  kRecvOffset,
  kNumRecv,
  kSubmitNs,
  kReserved,
  kRefusal,
  kByteFlip,
  kNumFields
};
const char* kFieldNames[kNumFields] = {"stamp",           "op",          "seq",         "dtype",       "count",
                                       "items_following", "send.region", "send.offset", "recv.region", "recv.offset",
                                       "num_recv",        "submit_ns",   "reserved",    "refusal",     "byte flip"};

uint64_t Interesting64(uint64_t& rng, uint64_t base) {
  static constexpr uint64_t kVals[] = {0,
                                       1,
                                       2,
                                       3,
                                       63,
                                       64,
                                       65,
                                       255,
                                       256,
                                       1023,
                                       1024,
                                       4095,
                                       4096,
                                       65535,
                                       65536,
                                       (1ull << 31),
                                       (1ull << 32),
                                       (1ull << 44),
                                       (1ull << 44) + 1,
                                       (1ull << 62),
                                       ~0ull,
                                       ~0ull - 10,
                                       0x8000000000000000ull};
  const uint64_t r = SplitMix64(rng);
  switch (r % 6) {
    case 0:
      return kVals[(r >> 8) % (sizeof(kVals) / sizeof(kVals[0]))];
    case 1:
      return base ^ (1ull << ((r >> 8) % 64));  // Bit flip.
    case 2:
      return SplitMix64(rng);  // Random.
    case 3:
      return base + ((r >> 8) % 17) - 8;  // Nearby.
    case 4:
      return base * ((r >> 8) % 4);  // Multiple.
    default:
      return (r >> 8) % 80;  // Small.
  }
}
uint32_t Interesting32(uint64_t& rng, uint32_t base) { return uint32_t(Interesting64(rng, base)); }

// Applies 1..3 mutations to `d` (a copy of the valid template).
void Mutate(uint64_t& rng, abi::DescriptorV2* d, MutateShared* sh) {
  const int n = 1 + int(SplitMix64(rng) % 3);
  if (SplitMix64(rng) % 4 == 0) d->stamp = abi::kDescriptorStampV1;  // A v1 descriptor (items_following ignored).
  for (int k = 0; k < n; ++k) {
    const Field f = Field(SplitMix64(rng) % kNumFields);
    sh->field_hits[f].fetch_add(1, std::memory_order_relaxed);
    const uint32_t i = SplitMix64(rng) % 4 == 0 ? uint32_t(SplitMix64(rng) % abi::kMaxRanksV1) : 0;
    switch (f) {
      case kStamp: {
        static constexpr uint32_t kStamps[] = {abi::kDescriptorStampV1, abi::kDescriptorStampV2,
                                               abi::Stamp(sizeof(abi::DescriptorV2), 3), 0};
        const uint64_t r = SplitMix64(rng);
        d->stamp = r % 2 ? kStamps[(r >> 8) % 4] : Interesting32(rng, d->stamp);
        break;
      }
      case kOp:
        d->op = Interesting32(rng, d->op) % (SplitMix64(rng) % 2 ? 5 : 0xffffffffu);
        break;
      case kSeq:
        d->seq = Interesting32(rng, d->seq);
        break;
      case kDtype:
        d->dtype = Interesting32(rng, d->dtype) % (SplitMix64(rng) % 2 ? 10 : 0xffffffffu);
        break;
      case kCount:
        d->count = Interesting64(rng, d->count);
        break;
      case kItems:
        d->items_following = Interesting32(rng, 0) % (SplitMix64(rng) % 2 ? 70 : 0xffffffffu);
        break;
      case kSendRegion:
        d->send.region_id = Interesting32(rng, d->send.region_id);
        break;
      case kSendOffset:
        d->send.offset = Interesting64(rng, d->send.offset);
        break;
      case kRecvRegion:
        d->recv[i].region_id = Interesting32(rng, d->recv[0].region_id);
        break;
      case kRecvOffset:
        d->recv[i].offset = Interesting64(rng, d->recv[0].offset);
        break;
      case kNumRecv:
        d->num_recv = Interesting32(rng, d->num_recv);
        break;
      case kSubmitNs:
        d->submit_ns = Interesting64(rng, d->submit_ns);
        break;
      case kReserved:
        if (SplitMix64(rng) % 2)
          d->send.reserved = Interesting32(rng, 0);
        else
          d->recv[i].reserved = Interesting32(rng, 0);
        break;
      case kRefusal: {
        d->op = abi::kOpRefuse;
        d->refusal.status = int32_t(Interesting32(rng, 1));
        const uint64_t r = SplitMix64(rng);
        if (r % 2) memset(d->refusal.reason, 'x', sizeof(d->refusal.reason));  // No NUL at all.
        for (int b = 0; b < 8; ++b)
          d->refusal.reason[SplitMix64(rng) % sizeof(d->refusal.reason)] = char(SplitMix64(rng));
        break;
      }
      case kByteFlip: {
        auto* bytes = reinterpret_cast<unsigned char*>(d);
        const int flips = 1 + int(SplitMix64(rng) % 8);
        for (int b = 0; b < flips; ++b) {
          // Biased to the head (56 bytes) where most fields are.
          const uint64_t r = SplitMix64(rng);
          const size_t at = r % 2 ? (r >> 8) % 56 : (r >> 8) % sizeof(abi::DescriptorV2);
          bytes[at] ^= uint8_t(1u << ((r >> 32) % 8));
        }
        break;
      }
      default:
        break;
    }
  }
}

// Rank 0 of the mutated job: takes over its ring after one valid op.
int MutatorRank(const std::string& socket, const std::string& job, int n, int window, uint64_t seed, MutateShared* sh,
                int8_t* status) {
  Comm comm(socket.c_str(), job, 2, 0);
  if (!comm.ok()) return sh->Say("mutator init: " + comm.error()), 2;
  char* buf = static_cast<char*>(comm.Alloc(kMutBufBytes));
  if (buf == nullptr) return sh->Say("mutator alloc: " + comm.error()), 2;
  const size_t count = kMutShardBytes / 4;
  FillPattern(buf, kMutShardBytes, 1, 0);
  dmagather_status_t st = comm.AllGather(buf, buf, count, DMAGATHER_FLOAT32);  // In place, rank 0's slot.
  if (st == DMAGATHER_OK) st = comm.Wait();
  if (st != DMAGATHER_OK) return sh->Say("mutator template op: " + comm.error()), 1;
  size_t seg_bytes = 0, bell_bytes = 0;
  char* seg = FindMapping("/memfd:dmagather-seg", &seg_bytes);
  char* bellp = FindMapping("/memfd:dmagather-doorbell", &bell_bytes);
  if (seg == nullptr || bellp == nullptr || seg_bytes < abi::SegmentLayoutV1::kBytes) {
    return sh->Say("mutator: segment or doorbell mapping not found in /proc/self/maps"), 1;
  }
  abi::SegmentViewV1 view = abi::SegmentViewV1::At(seg);
  auto* bell = reinterpret_cast<abi::DoorbellV1*>(bellp);
  if (view.header->magic != abi::kMagic || view.header->stamp != abi::kSegmentStampV1 || bell->magic != abi::kMagic) {
    return sh->Say("mutator: mappings found are not a segment and a doorbell"), 1;
  }
  abi::RingV1* ring = view.ring;
  abi::CompletionV1* c = view.completion;
  abi::DescriptorV2 tmpl;
  std::memcpy(&tmpl, &view.slots[(ring->tail - 1) % abi::kRingSlotsV1], sizeof(tmpl));
  if (tmpl.stamp != abi::kDescriptorStampV2 || abi::LoadAcquire(&c->done_seq) != tmpl.seq) {
    return sh->Say(absl::StrCat("mutator: unexpected template (stamp ", tmpl.stamp, ", seq ", tmpl.seq, ")")), 1;
  }
  const uint32_t first = tmpl.seq + 1;
  sh->ready.fetch_add(1);
  while (sh->ready.load() < 2) usleep(100);

  uint32_t scanned = abi::LoadAcquire(&c->error_count);
  uint32_t last_done = tmpl.seq;
  std::vector<int8_t> rec(abi::kRingSlotsV1, 0);
  std::vector<uint32_t> rec_seq(abi::kRingSlotsV1, 0);
  // Reads new error records and the statuses of ops finished since last time.
  auto scan = [&]() {
    const uint32_t done = abi::LoadAcquire(&c->done_seq);
    const uint32_t cnt = abi::LoadAcquire(&c->error_count);
    if (cnt - scanned > abi::kErrorSlotsV1) {
      sh->records_lost.fetch_add(cnt - scanned - abi::kErrorSlotsV1);
      scanned = cnt - abi::kErrorSlotsV1;
    }
    for (; scanned != cnt; ++scanned) {
      const abi::ErrorRecordV1& r = c->errors[scanned % abi::kErrorSlotsV1];
      rec[r.seq % abi::kRingSlotsV1] = int8_t(r.status);
      rec_seq[r.seq % abi::kRingSlotsV1] = r.seq;
    }
    for (; abi::SeqGeq(done, last_done + 1) && last_done != done;) {
      ++last_done;
      const uint32_t k = last_done % abi::kRingSlotsV1;
      const int idx = int(last_done - first);
      if (idx >= 0 && idx < n) status[idx] = rec_seq[k] == last_done ? rec[k] : 0;
      sh->progress[0].fetch_add(1);
    }
  };
  // Blocks until done_seq >= seq; false after the hang deadline.
  const uint64_t hang_ns = uint64_t(2 * absl::GetFlag(FLAGS_op_timeout_s) + 5) * 1000000000ull;
  auto wait_done = [&](uint32_t seq) {
    const uint64_t t0 = MonotonicNs();
    int spins = 0;
    for (;;) {
      scan();
      if (abi::SeqGeq(last_done, seq)) return true;
      if (MonotonicNs() - t0 > hang_ns) return false;
      if (++spins < 64) continue;
      abi::FetchAdd(&c->done_waiters, 1u);
      const uint32_t d = abi::LoadSeqCst(&c->done_seq);
      if (!abi::SeqGeq(d, seq)) dmagather::common::FutexWait(&c->done_seq, d, 2'000'000);
      abi::FetchAdd(&c->done_waiters, uint32_t(-1));
    }
  };
  auto publish = [&](const abi::DescriptorV2& d) {
    const uint64_t tail = ring->tail;
    while (tail - abi::LoadAcquire(&ring->head) >= abi::kRingSlotsV1) {
      scan();
      usleep(20);
    }
    std::memcpy(&view.slots[tail % abi::kRingSlotsV1], &d, sizeof(d));
    abi::StoreSeqCst(&ring->tail, tail + 1);
    if (abi::LoadSeqCst(&bell->sleeping) != 0) {
      abi::FetchAdd(&bell->seq, 1u);
      dmagather::common::FutexWakeAll(&bell->seq);
    }
    sh->descriptors.fetch_add(1, std::memory_order_relaxed);
  };

  uint64_t rng = seed;
  for (int i = 0; i < n; ++i) {
    const uint32_t seq = first + uint32_t(i);
    if (i >= window && !wait_done(seq - window)) {
      sh->hangs.fetch_add(1);
      sh->Say(absl::StrCat("mutator: op ", seq - window, " neither completed nor failed in time"));
      return 3;
    }
    abi::DescriptorV2 d = tmpl;
    d.seq = seq;
    d.submit_ns = MonotonicNs();
    d.items_following = 0;
    Mutate(rng, &d, sh);
    abi::StoreRelease(&c->ready_seq, seq);
    publish(d);
    // The daemon reads the items a valid v2 stamp announces as part of this
    // op (64 or more: the op fails and the next descriptor is the next op).
    const uint32_t extra =
        d.stamp == abi::kDescriptorStampV2 && d.items_following < abi::kMaxItemsPerOpV2 ? d.items_following : 0;
    for (uint32_t k = 0; k < extra; ++k) {
      abi::DescriptorV2 e = tmpl;
      e.seq = seq;
      e.submit_ns = MonotonicNs();
      e.items_following = extra - 1 - k;
      publish(e);
    }
  }
  if (!wait_done(first + uint32_t(n) - 1)) {
    sh->hangs.fetch_add(1);
    sh->Say("mutator: the last ops neither completed nor failed in time");
    return 3;
  }
  // The job is still usable: one more valid op (rank 1 submits it too),
  // through the ring as the template was, checked bit-exact.
  const uint32_t seq = first + uint32_t(n);
  FillPattern(buf, kMutShardBytes, 7, 0);
  abi::DescriptorV2 d = tmpl;
  d.seq = seq;
  d.submit_ns = MonotonicNs();
  abi::StoreRelease(&c->ready_seq, seq);
  publish(d);
  if (!wait_done(seq)) return sh->hangs.fetch_add(1), sh->Say("mutator: final op hung"), 3;
  std::vector<char> want(kMutShardBytes);
  bool ok = rec_seq[seq % abi::kRingSlotsV1] != seq;
  for (int r = 0; r < 2 && ok; ++r) {
    FillPattern(want.data(), kMutShardBytes, 7, r);
    ok = std::memcmp(buf + r * kMutShardBytes, want.data(), kMutShardBytes) == 0;
  }
  sh->final_ok[0] = ok ? 1 : 0;
  if (!ok) sh->Say("mutator: the valid op after the mutations failed or was not bit-exact");
  // Leave: the client's own count (1 op) is behind the daemon's; nothing waits.
  return 0;
}

// Rank 1 of the mutated job: the valid op every time; its own status of each.
int PartnerRank(const std::string& socket, const std::string& job, int n, int window, MutateShared* sh,
                int8_t* status) {
  Comm comm(socket.c_str(), job, 2, 1);
  if (!comm.ok()) return sh->Say("partner init: " + comm.error()), 2;
  char* buf = static_cast<char*>(comm.Alloc(kMutBufBytes));
  char* sentinel = static_cast<char*>(comm.Alloc(kMutBufBytes));  // Registered, never used by an op.
  if (buf == nullptr || sentinel == nullptr) return sh->Say("partner alloc: " + comm.error()), 2;
  std::memset(sentinel, 0x5A, kMutBufBytes);
  const size_t count = kMutShardBytes / 4;
  char* mine = buf + kMutShardBytes;
  FillPattern(mine, kMutShardBytes, 1, 1);
  dmagather_status_t st = comm.AllGather(mine, buf, count, DMAGATHER_FLOAT32);
  if (st == DMAGATHER_OK) st = comm.Wait();
  if (st != DMAGATHER_OK) return sh->Say("partner template op: " + comm.error()), 1;
  sh->ready.fetch_add(1);
  while (sh->ready.load() < 2) usleep(100);
  std::vector<dmagather_op_t> ops(n + 1);
  for (int i = 0; i <= n; ++i) {
    if (i >= window) {
      const int j = i - window;
      status[j] = int8_t(dmagather_op_wait(comm.get(), ops[j]));
      sh->progress[1].fetch_add(1);
    }
    if (i == n) FillPattern(mine, kMutShardBytes, 7, 1);  // The final, valid op.
    dmagather_status_t s = dmagather_allgather_async(comm.get(), mine, buf, count, DMAGATHER_FLOAT32, nullptr, &ops[i]);
    if (s == DMAGATHER_PEER_FAILED || s == DMAGATHER_UNAVAILABLE || s == DMAGATHER_TIMEOUT) {
      return sh->Say(absl::StrCat("partner: op ", i, " submit: ", comm.error())), 1;
    }
  }
  for (int j = std::max(0, n + 1 - window); j <= n; ++j) {
    const dmagather_status_t s = dmagather_op_wait(comm.get(), ops[j]);
    if (j < n) status[j] = int8_t(s), sh->progress[1].fetch_add(1);
    if (j == n) {
      std::vector<char> want(kMutShardBytes);
      bool ok = s == DMAGATHER_OK;
      for (int r = 0; r < 2 && ok; ++r) {
        FillPattern(want.data(), kMutShardBytes, 7, r);
        ok = std::memcmp(buf + r * kMutShardBytes, want.data(), kMutShardBytes) == 0;
      }
      sh->final_ok[1] = ok ? 1 : 0;
    }
  }
  uint64_t bad = 0;
  for (size_t i = 0; i < kMutBufBytes; ++i) bad += sentinel[i] != 0x5A;
  sh->sentinel_bad = bad;
  return 0;
}

void RunMutate(Daemon& daemon) {
  const uint64_t t0 = MonotonicNs();
  const int n = absl::GetFlag(FLAGS_mutations);
  const int window = std::clamp(absl::GetFlag(FLAGS_window), 1, 8);
  const int gw = absl::GetFlag(FLAGS_good_ranks);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const ProcStats before = ReadProc(daemon.pid());
  auto* sh = SharedArray<MutateShared>(1);
  auto* good = SharedArray<GoodJob>(1);
  int8_t* st = SharedArray<int8_t>(2 * size_t(n));
  for (size_t i = 0; i < 2 * size_t(n); ++i) st[i] = kNoStatus;
  const std::string socket = daemon.socket();
  const std::string gjob = absl::StrCat("good-", getpid()), mjob = absl::StrCat("mut-", getpid());
  std::vector<pid_t> good_pids;
  for (int r = 0; r < gw; ++r) {
    good_pids.push_back(Spawn([&, r] { return GoodRank(socket, gjob, gw, r, 4 << 10, 256 << 10, seed + 1, good); }));
  }
  pid_t m0 = Spawn([&] { return MutatorRank(socket, mjob, n, window, seed, sh, st); });
  pid_t m1 = Spawn([&] { return PartnerRank(socket, mjob, n, window, sh, st + n); });
  // Watchdog: the mutated job must make progress (or finish).
  const uint64_t hang_ns = uint64_t(2 * absl::GetFlag(FLAGS_op_timeout_s) + 5) * 1000000000ull;
  uint64_t last = 0, last_ns = MonotonicNs();
  int rc0 = -1, rc1 = -1;
  bool watchdog_fired = false;
  for (;;) {
    int s;
    if (rc0 < 0 && waitpid(m0, &s, WNOHANG) == m0) rc0 = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
    if (rc1 < 0 && waitpid(m1, &s, WNOHANG) == m1) rc1 = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
    if (rc0 >= 0 && rc1 >= 0) break;
    const uint64_t p = sh->progress[0] + sh->progress[1] + (sh->ready.load() ? 1 : 0);
    if (p != last) last = p, last_ns = MonotonicNs();
    const uint64_t allowed = hang_ns + (sh->ready.load() < 2 ? 60'000'000'000ull : 0);
    if (!watchdog_fired && MonotonicNs() - last_ns > allowed) {
      watchdog_fired = true;
      sh->hangs.fetch_add(1);
      if (rc0 < 0) kill(m0, SIGKILL);
      if (rc1 < 0) kill(m1, SIGKILL);
    }
    usleep(20000);
  }
  good->stop = 1;
  int good_bad_exit = 0;
  for (pid_t p : good_pids) good_bad_exit += Reap(p, hang_ns / 1e9 + 30) != 0;
  const bool alive = daemon.Alive();
  std::string health;
  const bool serving = alive && daemon.Healthy(&health);
  const ProcStats after = alive ? ReadProc(daemon.pid()) : ProcStats{};

  uint64_t disagree = 0, missing = 0, hist[8] = {};
  int first_disagree = -1;
  for (int i = 0; i < n; ++i) {
    if (st[i] == kNoStatus || st[n + i] == kNoStatus) {
      ++missing;
      continue;
    }
    if (st[i] != st[n + i]) {
      if (first_disagree < 0) first_disagree = i;
      ++disagree;
    }
    hist[std::clamp<int>(st[i], 0, 7)]++;
  }
  printf("\n== mutate: %d mutated descriptors (ops) + %" PRIu64
         " extra items they announced, window %d, daemon --op_timeout_s=%d\n",
         n, sh->descriptors.load() - n - 1, window, absl::GetFlag(FLAGS_op_timeout_s));
  printf("   fields mutated (1-3 per descriptor, 1/4 also turned into v1):");
  for (int f = 0; f < kNumFields; ++f) printf(" %s %" PRIu64 ",", kFieldNames[f], sh->field_hits[f].load());
  printf("\n   verdicts (rank 0 = rank 1):");
  for (int s = 0; s < 7; ++s)
    if (hist[s]) printf(" %s %" PRIu64, dmagather_status_string(dmagather_status_t(s)), hist[s]);
  printf("\n   cross-rank disagreements %" PRIu64 " (first at op %d), ops without a status %" PRIu64
         ", error records lost %" PRIu64 ", hangs %" PRIu64 "%s\n",
         disagree, first_disagree, missing, sh->records_lost.load(), sh->hangs.load(),
         watchdog_fired ? " (watchdog)" : "");
  if (first_disagree >= 0) {
    printf("   op %d: rank 0 %d, rank 1 %d\n", first_disagree, st[first_disagree], st[n + first_disagree]);
  }
  printf("   valid op after the mutations: rank 0 %s, rank 1 %s; bytes changed in rank 1's unused buffer: %" PRIu64
         "\n",
         sh->final_ok[0] ? "bit-exact" : "FAILED", sh->final_ok[1] ? "bit-exact" : "FAILED", sh->sentinel_bad.load());
  printf("   good job (%d ranks, 4 KiB-256 KiB shards): %" PRIu64 " ops, %.1f MiB checked, %" PRIu64
         " bad bytes, %" PRIu64 " failed ops\n",
         gw, good->ops.load(), good->bytes_checked / 1048576.0, good->bad_bytes.load(), good->failed_ops.load());
  printf("   daemon pid %d %s, health %s; before %s; after %s\n", daemon.pid(), alive ? "alive" : "DEAD",
         serving ? "SERVING" : "NOT SERVING", before.Str().c_str(), after.Str().c_str());
  if (sh->why_set) printf("   mutated job said: %s\n", sh->why);
  if (good->why_set) printf("   good job said: %s\n", good->why);
  printf("   exit codes: rank 0 %d, rank 1 %d, good ranks failing %d\n", rc0, rc1, good_bad_exit);

  Row row;
  row.run = "1. random descriptor mutations";
  row.load = absl::StrFormat("good job %d ranks: %u ops, %.0f MiB checked", gw, good->ops.load(),
                             good->bytes_checked / 1048576.0);
  row.faults = absl::StrFormat("%d mutated v1/v2 descriptors (+%u announced items) from 1 rank of a 2-rank job", n,
                               sh->descriptors.load() - n - 1);
  row.bad_inputs = absl::StrFormat("verdicts OK %u, INVALID_ARGUMENT %u, FALLBACK %u, other %u", hist[0], hist[2],
                                   hist[1], hist[3] + hist[4] + hist[5] + hist[6] + hist[7]);
  row.ok = alive && serving && sh->hangs == 0 && disagree == 0 && missing == 0 && sh->records_lost == 0 &&
           good->bad_bytes == 0 && good->failed_ops == 0 && good_bad_exit == 0 && sh->final_ok[0] && sh->final_ok[1] &&
           sh->sentinel_bad == 0 && rc0 == 0 && rc1 == 0;
  row.lost = absl::StrFormat("%sdaemon crashes %d, hangs %u, cross-rank disagreements %u, good-job bad bytes %u/%u ops",
                             serving || !alive ? "" : "daemon NOT SERVING; ", alive ? 0 : 1, sh->hangs.load(), disagree,
                             good->bad_bytes.load(), good->ops.load());
  row.seconds = Seconds(t0, MonotonicNs());
  g_rows.push_back(row);
}

// -------------------------------------------------------------- run: kill.

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

int KillRank(const std::string& socket, const std::string& job, int world, int rank, int victim, KillShared* sh) {
  Comm comm(socket.c_str(), job, world, rank);
  if (!comm.ok()) {
    if (sh->why_set.fetch_add(1) == 0) snprintf(sh->why, sizeof(sh->why), "init: %s", comm.error().c_str());
    return 2;
  }
  const size_t shard = 16 << 10;
  char* send = static_cast<char*>(comm.Alloc(shard));
  char* recv = static_cast<char*>(comm.Alloc(shard * world));
  if (send == nullptr || recv == nullptr) return 2;
  std::vector<char> want(shard);
  for (uint64_t op = 0;; ++op) {
    FillPattern(send, shard, op, rank);
    dmagather_status_t st = comm.AllGather(send, recv, shard / 8, DMAGATHER_INT64);
    if (st == DMAGATHER_OK) st = comm.Wait();
    if (st != DMAGATHER_OK) {
      sh->error_ns[rank] = MonotonicNs();
      sh->status[rank] = st;
      sh->names_victim[rank] = comm.error().find(absl::StrCat("rank ", victim)) != std::string::npos;
      return 0;
    }
    for (int r = 0; r < world; ++r) {
      FillPattern(want.data(), shard, op, r);
      if (std::memcmp(recv + r * shard, want.data(), shard) != 0) sh->bad.fetch_add(1);
    }
    sh->ops_checked.fetch_add(1);
    if (op == 2) sh->ready.fetch_add(1);
  }
}

void RunKill(Daemon& daemon) {
  const uint64_t t0 = MonotonicNs();
  const int kills = absl::GetFlag(FLAGS_kills);
  const int world = std::clamp(absl::GetFlag(FLAGS_kill_world), 2, 8);
  const ProcStats before = ReadProc(daemon.pid());
  const std::string socket = daemon.socket();
  const double hang_s = 2 * absl::GetFlag(FLAGS_op_timeout_s) + 5;
  uint64_t rng = absl::GetFlag(FLAGS_seed) * 7 + 1;
  std::vector<double> lat_ms;
  int survivors = 0, peer_failed = 0, named = 0, hangs = 0, setup_failures = 0, other = 0;
  uint64_t ops = 0, bad = 0;
  std::string first_problem;
  for (int it = 0; it < kills; ++it) {
    auto* sh = SharedArray<KillShared>(1);
    const int victim = int(SplitMix64(rng) % world);
    const std::string job = absl::StrCat("kill-", getpid(), "-", it);
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r)
      pids.push_back(Spawn([&, r] { return KillRank(socket, job, world, r, victim, sh); }));
    const uint64_t deadline = MonotonicNs() + 60'000'000'000ull;
    while (sh->ready.load() < world && MonotonicNs() < deadline) usleep(1000);
    if (sh->ready.load() < world) {
      ++setup_failures;
      if (first_problem.empty()) first_problem = absl::StrCat("iteration ", it, ": ranks not running: ", sh->why);
      for (pid_t p : pids) kill(p, SIGKILL), Reap(p, 5);
      munmap(sh, sizeof(KillShared));
      continue;
    }
    usleep(useconds_t(SplitMix64(rng) % 20000));  // A random moment, mostly mid-op.
    const uint64_t kill_ns = MonotonicNs();
    kill(pids[victim], SIGKILL);
    for (int r = 0; r < world; ++r) {
      bool to = false;
      const int rc = Reap(pids[r], r == victim ? 5 : hang_s, &to);
      if (r == victim) continue;
      ++survivors;
      if (to) {
        ++hangs;
        if (first_problem.empty()) first_problem = absl::StrCat("iteration ", it, ": rank ", r, " hung");
        continue;
      }
      if (rc == 0 && sh->status[r] == DMAGATHER_PEER_FAILED) {
        ++peer_failed;
        named += sh->names_victim[r].load();
        lat_ms.push_back((sh->error_ns[r].load() - kill_ns) / 1e6);
      } else {
        ++other;
        if (first_problem.empty()) {
          first_problem = absl::StrCat("iteration ", it, ": rank ", r, " exit ", rc, " status ", sh->status[r].load());
        }
      }
    }
    ops += sh->ops_checked;
    bad += sh->bad;
    munmap(sh, sizeof(KillShared));
  }
  std::sort(lat_ms.begin(), lat_ms.end());
  auto pct = [&](double q) {
    return lat_ms.empty() ? 0.0 : lat_ms[std::min(lat_ms.size() - 1, size_t(q * lat_ms.size()))];
  };
  usleep(200000);  // The reaper retires the last sessions.
  const bool alive = daemon.Alive();
  const bool serving = alive && daemon.Healthy();
  const ProcStats after = alive ? ReadProc(daemon.pid()) : ProcStats{};
  printf("\n== kill: %d jobs of %d ranks, one rank SIGKILLed at a random moment (0-20 ms after all ran 3 ops)\n", kills,
         world);
  printf("   survivors %d: PEER_FAILED %d (naming the killed rank %d), other %d, hangs %d; setup failures %d\n",
         survivors, peer_failed, named, other, hangs, setup_failures);
  printf("   kill -> PEER_FAILED: p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", pct(0.5), pct(0.99),
         lat_ms.empty() ? 0 : lat_ms.back());
  printf("   ops before the kills, checked bit-exact: %" PRIu64 ", bad results %" PRIu64 "\n", ops, bad);
  printf("   daemon %s, health %s; before %s; after %s\n", alive ? "alive" : "DEAD",
         serving ? "SERVING" : "NOT SERVING", before.Str().c_str(), after.Str().c_str());
  if (!first_problem.empty()) printf("   first problem: %s\n", first_problem.c_str());
  Row row;
  row.run = "2. rank SIGKILLs";
  row.load = absl::StrFormat("%d jobs x %d ranks, %u ops checked before the kills", kills, world, ops);
  row.faults = absl::StrFormat("%d rank SIGKILLs mid-run", kills - setup_failures);
  row.bad_inputs = "-";
  row.ok = alive && serving && peer_failed == survivors && survivors == kills * (world - 1) && hangs == 0 && bad == 0 &&
           setup_failures == 0;
  row.lost = absl::StrFormat(
      "%sdaemon crashes %d; %d/%d survivors got PEER_FAILED (p50 %.1f ms, p99 %.1f ms, max %.1f ms), hangs %d, bad "
      "results %u",
      serving || !alive ? "" : "daemon NOT SERVING; ", alive ? 0 : 1, peer_failed, survivors, pct(0.5), pct(0.99),
      lat_ms.empty() ? 0 : lat_ms.back(), hangs, bad);
  row.seconds = Seconds(t0, MonotonicNs());
  g_rows.push_back(row);
}

// ----------------------------------------------------------- run: restart.

void RunRestart(const std::string& base) {
  const uint64_t t0 = MonotonicNs();
  const int cycles = absl::GetFlag(FLAGS_restarts);
  const std::string dir = base + "/restart";
  mkdir(dir.c_str(), 0700);
  Daemon daemon(dir, {});
  int unavailable = 0, hangs = 0, other = 0, restart_failed = 0, stale = 0, new_job_bad = 0, shm_left = 0;
  std::vector<double> lat_ms;
  std::string first_problem;
  auto problem = [&](const std::string& s) {
    if (first_problem.empty()) first_problem = s;
  };
  if (!daemon.Start()) {
    printf("restart: the daemon did not start\n");
    restart_failed = cycles;
  }
  const std::vector<std::string> shm_before = DirEntries("/dev/shm", "dmagather");
  for (int cyc = 0; cyc < cycles && restart_failed == 0; ++cyc) {
    const std::string socket = daemon.socket();
    // The old job: 2 ranks running ops until something fails.
    auto* sh = SharedArray<KillShared>(1);
    const std::string job = absl::StrCat("old-", getpid(), "-", cyc);
    std::vector<pid_t> pids;
    for (int r = 0; r < 2; ++r) pids.push_back(Spawn([&, r] { return KillRank(socket, job, 2, r, -1, sh); }));
    const uint64_t deadline = MonotonicNs() + 60'000'000'000ull;
    while (sh->ready.load() < 2 && MonotonicNs() < deadline) usleep(1000);
    usleep(20000);
    const uint64_t kill_ns = MonotonicNs();
    const int ds = daemon.Stop(SIGKILL);
    if (!(WIFSIGNALED(ds) && WTERMSIG(ds) == SIGKILL)) problem(absl::StrCat("cycle ", cyc, ": daemon status ", ds));
    for (int r = 0; r < 2; ++r) {
      bool to = false;
      const int rc = Reap(pids[r], 10, &to);
      if (to) {
        ++hangs;
        problem(absl::StrCat("cycle ", cyc, ": old rank ", r, " hung after the daemon was killed"));
      } else if (rc == 0 && sh->status[r] == DMAGATHER_UNAVAILABLE) {
        ++unavailable;
        lat_ms.push_back((sh->error_ns[r].load() - kill_ns) / 1e6);
      } else {
        ++other;
        problem(absl::StrCat("cycle ", cyc, ": old rank ", r, " exit ", rc, " status ", sh->status[r].load(), " ",
                             sh->why));
      }
    }
    munmap(sh, sizeof(KillShared));
    // Restart on the same path; afterwards only the new daemon's files exist.
    if (!daemon.Start()) {
      ++restart_failed;
      problem(absl::StrCat("cycle ", cyc, ": restart failed"));
      break;
    }
    const std::vector<std::string> files = DirEntries(dir);
    const std::vector<std::string> want = {"dmagatherd.log", "dmagatherd.sock", "dmagatherd.sock.fd"};
    if (files != want) {
      ++stale;
      problem(absl::StrCat("cycle ", cyc, ": socket dir holds ", Join(files)));
    }
    if (DirEntries("/dev/shm", "dmagather") != shm_before) ++shm_left;
    // A new job, bit-exact.
    auto* g = SharedArray<GoodJob>(1);
    g->stop_at = 20;
    const std::string njob = absl::StrCat("new-", getpid(), "-", cyc);
    std::vector<pid_t> np;
    for (int r = 0; r < 2; ++r) {
      np.push_back(Spawn([&, r] { return GoodRank(socket, njob, 2, r, 4 << 10, 1 << 20, 1000 + cyc, g); }));
    }
    int bad_exit = 0;
    for (pid_t p : np) bad_exit += Reap(p, 60) != 0;
    if (bad_exit || g->bad_bytes || g->ops != 20) {
      ++new_job_bad;
      problem(absl::StrCat("cycle ", cyc, ": new job: ", g->why));
    }
    munmap(g, sizeof(GoodJob));
  }
  const bool serving = daemon.Alive() && daemon.Healthy();
  const int term = daemon.Stop(SIGTERM);
  const std::vector<std::string> left = DirEntries(dir);
  const bool clean_end =
      WIFEXITED(term) && WEXITSTATUS(term) == 0 && left == std::vector<std::string>{"dmagatherd.log"};
  const std::vector<std::string> shm_after = DirEntries("/dev/shm", "dmagather");
  std::sort(lat_ms.begin(), lat_ms.end());
  const double p50 = lat_ms.empty() ? 0 : lat_ms[lat_ms.size() / 2], mx = lat_ms.empty() ? 0 : lat_ms.back();
  printf("\n== restart: %d cycles of SIGKILL of the daemon under a running 2-rank job, restart on the same socket\n",
         cycles);
  printf("   old ranks: UNAVAILABLE %d/%d (kill -> error p50 %.1f ms, max %.1f ms), other %d, hangs %d\n", unavailable,
         2 * cycles, p50, mx, other, hangs);
  printf(
      "   restarts failed %d, cycles with stale files in the socket dir %d, with new /dev/shm entries %d, new jobs not "
      "bit-exact %d\n",
      restart_failed, stale, shm_left, new_job_bad);
  printf(
      "   after SIGTERM: exit %d, socket dir holds %s; /dev/shm dmagather entries: before %s, after %s; health before "
      "stop %s\n",
      WIFEXITED(term) ? WEXITSTATUS(term) : -1, Join(left).c_str(), Join(shm_before).c_str(), Join(shm_after).c_str(),
      serving ? "SERVING" : "NOT SERVING");
  if (!first_problem.empty()) printf("   first problem: %s\n", first_problem.c_str());
  Row row;
  row.run = "3. daemon SIGKILL + restart";
  row.load = absl::StrFormat("a 2-rank job running in each cycle; a new 2-rank job x 20 ops after each restart");
  row.faults = absl::StrFormat("%d daemon SIGKILLs + restarts on the same socket path", cycles);
  row.bad_inputs = "stale sockets of the killed daemon, every time";
  row.ok = unavailable == 2 * cycles && hangs == 0 && other == 0 && restart_failed == 0 && stale == 0 &&
           shm_left == 0 && new_job_bad == 0 && clean_end && serving && shm_after == shm_before;
  row.lost = absl::StrFormat(
      "%d/%d old ranks got UNAVAILABLE (max %.0f ms), hangs %d, failed restarts %d, stale files %d, new jobs not "
      "bit-exact %d/%d",
      unavailable, 2 * cycles, mx, hangs, restart_failed, stale + shm_left + (clean_end ? 0 : 1), new_job_bad, cycles);
  row.seconds = Seconds(t0, MonotonicNs());
  g_rows.push_back(row);
}

// -------------------------------------------------------------- run: soak.

void RunSoak(Daemon& daemon) {
  const uint64_t t0 = MonotonicNs();
  const int jobs = absl::GetFlag(FLAGS_soak_jobs), ranks = absl::GetFlag(FLAGS_soak_ranks);
  const int secs = absl::GetFlag(FLAGS_soak_s);
  const size_t min_b = size_t(absl::GetFlag(FLAGS_soak_min_kib)) << 10,
               max_b = size_t(absl::GetFlag(FLAGS_soak_max_kib)) << 10;
  const ProcStats before = ReadProc(daemon.pid());
  const std::string socket = daemon.socket();
  auto* g = SharedArray<GoodJob>(jobs);
  std::vector<pid_t> pids;
  for (int j = 0; j < jobs; ++j) {
    const std::string job = absl::StrCat("soak-", getpid(), "-", j);
    for (int r = 0; r < ranks; ++r) {
      pids.push_back(Spawn([&, j, r, job] {
        return GoodRank(socket, job, ranks, r, min_b, max_b, absl::GetFlag(FLAGS_seed) * 31 + j, &g[j]);
      }));
    }
  }
  ProcStats peak = before, during = before;
  const uint64_t end = MonotonicNs() + uint64_t(secs) * 1000000000ull;
  while (MonotonicNs() < end) {
    sleep(1);
    if (!daemon.Alive()) break;
    during = ReadProc(daemon.pid());
    peak.rss_kib = std::max(peak.rss_kib, during.rss_kib);
    peak.anon_kib = std::max(peak.anon_kib, during.anon_kib);
    peak.threads = std::max(peak.threads, during.threads);
    peak.fds = std::max(peak.fds, during.fds);
  }
  for (int j = 0; j < jobs; ++j) g[j].stop = 1;
  int bad_exit = 0;
  for (pid_t p : pids) bad_exit += Reap(p, 2 * absl::GetFlag(FLAGS_op_timeout_s) + 60) != 0;
  usleep(500000);  // The reaper retires the sessions.
  const bool alive = daemon.Alive();
  const bool serving = alive && daemon.Healthy();
  const ProcStats after = alive ? ReadProc(daemon.pid()) : ProcStats{};
  uint64_t ops = 0, bytes = 0, bad = 0, failed = 0;
  std::string why;
  for (int j = 0; j < jobs; ++j) {
    ops += g[j].ops;
    bytes += g[j].bytes_checked;
    bad += g[j].bad_bytes;
    failed += g[j].failed_ops;
    if (g[j].why_set && why.empty()) why = g[j].why;
  }
  const double wall = Seconds(t0, MonotonicNs());
  printf(
      "\n== soak: %d jobs x %d ranks for %d s, shards %zu KiB-%zu KiB (log-uniform; 5 dtypes; flat, in place, list)\n",
      jobs, ranks, secs, min_b >> 10, max_b >> 10);
  printf("   ops %" PRIu64 ", output bytes checked %.2f GiB, corrupt bytes %" PRIu64 ", failed ops %" PRIu64
         ", ranks exiting non-zero %d\n",
         ops, bytes / double(1ull << 30), bad, failed, bad_exit);
  printf(
      "   daemon %s, health %s\n   daemon at start: %s\n   daemon peak:     %s\n   daemon at end:   %s (jobs gone)\n",
      alive ? "alive" : "DEAD", serving ? "SERVING" : "NOT SERVING", before.Str().c_str(), peak.Str().c_str(),
      after.Str().c_str());
  if (!why.empty()) printf("   first problem: %s\n", why.c_str());
  Row row;
  row.run = "4. soak";
  row.load = absl::StrFormat("%d jobs x %d ranks, %d s, %zu KiB-%zu KiB shards: %u ops, %.1f GiB checked", jobs, ranks,
                             secs, min_b >> 10, max_b >> 10, ops, bytes / double(1ull << 30));
  row.faults = "-";
  row.bad_inputs = "-";
  row.ok = alive && serving && bad == 0 && failed == 0 && bad_exit == 0 && ops > 0;
  row.lost =
      absl::StrFormat("%sdaemon crashes %d, corrupt bytes %u, failed ops %u; daemon RSS %.0f->%.0f MiB, threads %d->%d",
                      serving || !alive ? "" : "daemon NOT SERVING; ", alive ? 0 : 1, bad, failed,
                      before.rss_kib / 1024.0, after.rss_kib / 1024.0, int(before.threads), int(after.threads));
  row.seconds = wall;
  g_rows.push_back(row);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "robustness --dmagatherd=PATH --dmagatherctl=PATH [--runs=mutate,kill,restart,soak]: the robustness table");
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  std::string base = absl::GetFlag(FLAGS_dir);
  if (base.empty()) {
    char tmpl[] = "/tmp/dmagather-robust-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return perror("mkdtemp"), 2;
    base = tmpl;
  }
  const std::vector<std::string> runs = absl::StrSplit(absl::GetFlag(FLAGS_runs), ',', absl::SkipEmpty());
  const uint64_t t0 = MonotonicNs();
  // mutate, kill and soak share one daemon (it must survive all of them);
  // restart kills its own.
  std::unique_ptr<Daemon> shared;
  int daemon_failures = 0;
  for (const std::string& run : runs) {
    if (run == "restart") {
      RunRestart(base);
      continue;
    }
    if (run != "mutate" && run != "kill" && run != "soak") {
      fprintf(stderr, "unknown run %s\n", run.c_str());
      return 2;
    }
    if (shared == nullptr || !shared->Alive()) {
      if (shared != nullptr) ++daemon_failures;
      const std::string dir = base + "/shared";
      mkdir(dir.c_str(), 0700);
      shared = std::make_unique<Daemon>(dir, std::vector<std::string>{});
      if (!shared->Start()) return 2;
      printf("dmagatherd pid %d on %s (--backend=host, --op_timeout_s=%d)\n", shared->pid(), shared->socket().c_str(),
             absl::GetFlag(FLAGS_op_timeout_s));
    }
    if (run == "mutate") RunMutate(*shared);
    if (run == "kill") RunKill(*shared);
    if (run == "soak") RunSoak(*shared);
  }
  bool all_ok = daemon_failures == 0;
  if (shared != nullptr) {
    all_ok = all_ok && shared->Alive();
    const int st = shared->Stop(SIGTERM);
    printf("\nshared daemon: SIGTERM -> exit %d; socket dir after: %s\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1,
           Join(DirEntries(base + "/shared")).c_str());
  }
  PrintTable();
  for (const Row& r : g_rows) all_ok = all_ok && r.ok;
  printf("\n%s in %.0f s\n", all_ok ? "NOTHING LOST" : "SOMETHING WAS LOST", Seconds(t0, MonotonicNs()));
  if (all_ok) {
    std::string cmd = "rm -rf '" + base + "'";
    if (system(cmd.c_str()) != 0) {
    }
  } else {
    printf("kept %s (daemon logs)\n", base.c_str());
  }
  return all_ok ? 0 : 1;
}

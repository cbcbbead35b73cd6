// Run "mutate": mutated descriptors written straight into a rank's request
// ring beside a job checked bit-exact (robustness.h has the whole account).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <fstream>

#include "abi/completion_v1.h"
#include "abi/descriptor_v2.h"
#include "abi/ring_v1.h"
#include "bench/robustness/robustness.h"
#include "common/futex.h"

namespace dmagather::bench::robustness {

namespace {

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

}  // namespace

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

}  // namespace dmagather::bench::robustness

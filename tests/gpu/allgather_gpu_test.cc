// GPU tests of the cuda backend, against a running dmagatherd
// --backend=cuda (DMAGATHER_SOCKET). Each --mode forks its ranks as
// processes (all on the current GPU), checks results on the GPU with the
// verification kernels, and exits 0 only if every check held. Prints one
// "PASS <mode>" or "FAIL <mode>: why" line. tests/gpu/run.sh runs them all.
//
//   dtypes    every dtype x counts {1,3,4095,1Mi+7,256 MiB of elements} x
//             {out of place, in place, list}, 4 ranks
//   suballoc  two tensors inside one cudaMalloc at odd offsets, registered
//             with dmagather_register; then the allocation freed and a new
//             one registered in its place (buffer id changes)
//   stream    producer kernel -> allgather -> consumer kernel, 300 times on
//             one stream, no host synchronisation until the end
//             ($DMAGATHER_TEST_STREAM_ITERS times where set)
//   eight     8 ranks, out of place and list
//   kill      3 ranks; rank 2 is SIGKILLed while an op waits on its stream;
//             ranks 0,1 get DMAGATHER_PEER_FAILED within 1 s and their
//             streams do not hang; then a second job is served correctly
//   mismatch  ranks disagree on count: every rank gets an error on wait and
//             its stream does not hang
//   ophandles per-op handles: producer on one stream -> dmagather_allgather_
//             async -> dmagather_op_wait_stream on a second (consumer)
//             stream -> check there; 100 ops, no host sync until the end;
//             dmagather_op_test reports every op done and OK
//   coalesced dmagather_allgather_coalesced of 4 tensors (dtypes, counts,
//             in/out of place mixed) in one op, checked on the GPU, 20 times
//   fallback  3 ranks; rank 1's output is host memory (which the cuda
//             backend cannot reach): every rank's op completes with
//             DMAGATHER_FALLBACK naming rank 1, no stream hangs, no output
//             byte is touched, and the next op is bit-exact
//   vmm       VMM memory (cuMemCreate with a POSIX fd handle type, 2 MiB
//             chunks mapped back to back, as PyTorch's expandable segments):
//             send and output tensors that span several chunks at odd
//             offsets, registered on submit; then a chunk under the output
//             unmapped and a new allocation mapped at the same address (the
//             client must re-register: the old import still holds the old
//             memory), and the output range grown by a newly mapped chunk;
//             bit-exact every time; host cost of the per-submit check
//   vmm_unshareable  3 ranks; rank 1's output is VMM memory created without
//             a shareable handle type: every rank's op completes with
//             DMAGATHER_FALLBACK naming rank 1 and the reason (never
//             INVALID_ARGUMENT), no stream hangs, the next op is bit-exact
//   graph     producer kernel (seed from a device step counter) ->
//             AllGather (out of place, and in place on a second buffer) ->
//             consumer check kernel, captured into one CUDA graph, replayed
//             100 times ($DMAGATHER_TEST_GRAPH_REPLAYS where set) with no
//             host synchronisation between replays: every replay bit-exact
//             on every rank; then an ordinary op
#include <cuda.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/cuda/cuda_api.h"
#include "dmagather/client.h"
#include "kernels/verify.h"
#include "tests/gpu/ranks.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Shared {
  std::atomic<int> step[8];
  std::atomic<int> failures;
  char why[512];
  double kill_to_error_ms[8];
  int status_seen[8];
};
Shared* sh = nullptr;

void Fail(const std::string& why) {
  if (sh->failures.fetch_add(1) == 0) snprintf(sh->why, sizeof(sh->why), "%s", why.c_str());
  fprintf(stderr, "  check failed: %s\n", why.c_str());
}

#define CK(x)                                                \
  do {                                                       \
    cudaError_t e_ = (x);                                    \
    if (e_ != cudaSuccess) {                                 \
      Fail(std::string(#x) + " -> " + cudaGetErrorName(e_)); \
      return 1;                                              \
    }                                                        \
  } while (0)

std::string Job(const char* mode) { return std::string("gputest-") + mode + "-" + std::to_string(getppid()); }

struct Checker {
  unsigned long long* d = nullptr;  // [0] mismatches, [1] first bad offset
  int Init() {
    if (cudaMalloc(&d, 16) != cudaSuccess) return 1;
    return Reset(nullptr);
  }
  int Reset(cudaStream_t s) {
    unsigned long long h[2] = {0, ~0ull};
    return cudaMemcpyAsync(d, h, 16, cudaMemcpyHostToDevice, s) == cudaSuccess &&
                   cudaStreamSynchronize(s) == cudaSuccess
               ? 0
               : 1;
  }
  int Compare(const void* p, size_t bytes, uint64_t seed, int rank, cudaStream_t s) {
    return dmagather::kernels::ComparePattern(p, bytes, seed, rank, d, d + 1, s);
  }
  // Compares each rank's shard of `recv` against that rank's pattern.
  void CompareShards(const char* recv, size_t shard, int world, uint64_t seed, cudaStream_t s, int rank_offset = 0) {
    for (int r = 0; r < world; ++r) Compare(recv + r * shard, shard, seed, r + rank_offset, s);
  }
  // Syncs the stream and returns the mismatch count (first offset in *first).
  unsigned long long Read(cudaStream_t s, unsigned long long* first) {
    unsigned long long h[2] = {~0ull, ~0ull};
    if (cudaStreamSynchronize(s) != cudaSuccess || cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost) != cudaSuccess)
      return ~0ull;
    if (first) *first = h[1];
    return h[0];
  }
};

// --- What every mode's rank starts from, and the checks they share ---

// A rank of a mode: its Comm (job gputest-<mode>-<pid>), and where the mode
// asks for them (ModeSpec::setup) a non-blocking stream and a checker.
struct Env {
  dmagather::Comm& c;
  int rank, world;
  cudaStream_t s = nullptr;
  Checker ck;
  std::string Rank() const { return "rank " + std::to_string(rank); }
};

// Fails the check with "rank R: what"; returns 1 (a failed rank's exit code).
int FailRank(const Env& e, const std::string& what) {
  Fail(e.Rank() + ": " + what);
  return 1;
}

bool Ok(dmagather::Comm& c, dmagather_status_t st, const std::string& what) {
  if (st == DMAGATHER_OK) return true;
  Fail("rank " + std::to_string(c.rank()) + " " + what + ": " + dmagather_status_string(st) + ": " + c.error());
  return false;
}

// dmagather_alloc'ed device memory; nullptr (the check failed) on error.
char* Alloc(Env& e, size_t bytes) {
  char* p = static_cast<char*>(e.c.Alloc(bytes));
  if (p == nullptr) Fail("alloc: " + e.c.error());
  return p;
}

// Every rank stores 1 in its step and waits until all have: a start line.
void StartLine(const Env& e) {
  sh->step[e.rank].store(1);
  for (int r = 0; r < e.world; ++r)
    while (sh->step[r].load() < 1) usleep(100);
}

// Waits until every op on `s` is done (cudaSuccess), or `limit` passes.
cudaError_t DrainWithin(cudaStream_t s, std::chrono::seconds limit) {
  const auto t0 = Clock::now();
  cudaError_t q;
  while ((q = cudaStreamQuery(s)) == cudaErrorNotReady && Clock::now() - t0 < limit) usleep(1000);
  return q;
}

// The verdict of the checks read from a Checker: none wrong, or the check fails.
int NoWrongWords(const Env& e, unsigned long long bad, unsigned long long first, const std::string& where) {
  if (bad == 0) return 0;
  return FailRank(e, std::to_string(bad) + " wrong words " + where + ", first at byte " + std::to_string(first));
}

// One checked AllGather: the output poisoned (and this rank's shard with
// another value when the input is elsewhere), the input filled with this
// rank's pattern, gathered (flat, or as a list of shard pointers), every
// shard compared bit-exact on the GPU, the op waited for.
struct Gather {
  char* in;    // This rank's input: its shard of recv (in place) or elsewhere.
  char* recv;  // world shards.
  size_t count;
  dmagather_dtype_t dt;
  bool list;
  uint64_t seed;
  std::string label;
};
int CheckGather(Env& e, const Gather& g) {
  const size_t shard = g.count * dmagather_dtype_size(g.dt);
  char* own = g.recv + e.rank * shard;
  CK(cudaMemsetAsync(g.recv, 0xA5, shard * e.world, e.s));  // Poison.
  if (g.in != own) CK(cudaMemsetAsync(own, 0x5A, shard, e.s));
  if (dmagather::kernels::FillPattern(g.in, shard, g.seed, e.rank, e.s) != 0) {
    Fail("fill");
    return 1;
  }
  dmagather_status_t st;
  if (g.list) {
    std::vector<void*> outs(e.world);
    for (int r = 0; r < e.world; ++r) outs[r] = g.recv + r * shard;
    st = e.c.AllGatherList(g.in, outs, g.count, g.dt, e.s);
  } else {
    st = e.c.AllGather(g.in, g.recv, g.count, g.dt, e.s);
  }
  if (!Ok(e.c, st, g.label + " submit")) return 1;
  e.ck.CompareShards(g.recv, shard, e.world, g.seed, e.s);
  unsigned long long first = 0;
  const unsigned long long bad = e.ck.Read(e.s, &first);
  if (!Ok(e.c, e.c.Wait(), g.label + " wait")) return 1;
  if (bad == 0) return 0;
  e.ck.Reset(e.s);
  return NoWrongWords(e, bad, first, g.label + " (shard of rank " + std::to_string(shard ? first / shard : 0) + ")");
}

// The three layouts of a flat AllGather: out of place, in place, list.
struct Variant {
  const char* name;
  bool in_place, list;
};
constexpr Variant kVariants[] = {{"out-of-place", false, false}, {"in-place", true, false}, {"list", false, true}};

int CheckVariant(Env& e, char* send, char* recv, dmagather_dtype_t dt, size_t count, const Variant& v, uint64_t seed,
                 const std::string& label) {
  char* in = v.in_place ? recv + e.rank * count * dmagather_dtype_size(dt) : send;
  return CheckGather(e, Gather{in, recv, count, dt, v.list, seed, label});
}

// An op that rank 1 cannot have served (its output is memory the backend
// cannot reach): rank 1's submit says FALLBACK at once, and every rank's op
// completes FALLBACK naming rank 1 (and `reason_names`, if given), its
// stream not held. `poisoned` (device memory) was set to 0x33 first.
int ExpectFallbackOfRank1(Env& e, char* send, char* poisoned, void* out, size_t bytes, uint64_t seed,
                          const std::string& rank1_output, const std::string& reason_names, std::string* why) {
  CK(cudaMemsetAsync(poisoned, 0x33, bytes * e.world, e.s));
  dmagather::kernels::FillPattern(send, bytes, seed, e.rank, e.s);
  dmagather_op_t op = 0;
  dmagather_status_t st = dmagather_allgather_async(e.c.get(), send, out, bytes, DMAGATHER_UINT8, e.s, &op);
  if (e.rank == 1 && st != DMAGATHER_FALLBACK) {
    Fail("rank 1 (" + rank1_output + ") submit returned " + dmagather_status_string(st) + ": " + e.c.error());
    return 1;
  }
  if (op == 0) return FailRank(e, "no op handle");
  dmagather_op_wait_stream(e.c.get(), op, e.s);
  st = dmagather_op_wait(e.c.get(), op);
  *why = e.c.error();
  if (st != DMAGATHER_FALLBACK || why->find("rank 1") == std::string::npos ||
      (!reason_names.empty() && why->find(reason_names) == std::string::npos)) {
    return FailRank(e, std::string("op_wait returned ") + dmagather_status_string(st) + " (" + *why +
                           "), expected FALLBACK naming rank 1" +
                           (reason_names.empty() ? "" : " and the missing " + reason_names + " type"));
  }
  return 0;
}

// --- The modes: each a function of one rank ---

int ModeDtypes(Env& e) {
  if (e.c.backend() != "cuda") {
    Fail("backend is " + e.c.backend());
    return 1;
  }
  const size_t max_shard = size_t(256) << 20;
  char* send = Alloc(e, max_shard);
  char* recv = Alloc(e, max_shard * e.world);
  if (!send || !recv) return 1;
  int bad = 0;
  uint64_t seed = 1000;
  for (int d = 0; d < DMAGATHER_NUM_DTYPES; ++d) {
    const auto dt = static_cast<dmagather_dtype_t>(d);
    const size_t es = dmagather_dtype_size(dt);
    for (size_t count : {size_t(1), size_t(3), size_t(4095), size_t((1 << 20) + 7), max_shard / es}) {
      for (const Variant& v : kVariants) {
        const std::string label =
            std::string(dmagather_dtype_name(dt)) + " count=" + std::to_string(count) + " " + v.name;
        bad += CheckVariant(e, send, recv, dt, count, v, ++seed, label);
      }
    }
  }
  if (e.rank == 0) printf("  dtypes: %d checks per rank, %d failed on rank 0\n", DMAGATHER_NUM_DTYPES * 5 * 3, bad);
  return bad != 0;
}

int ModeSuballoc(Env& e) {
  const size_t count = 300007;  // int8: odd sizes everywhere
  const size_t arena_bytes = 16 << 20;
  int bad = 0;
  for (int round = 0; round < 3; ++round) {
    char* arena = nullptr;
    CK(cudaMalloc(&arena, arena_bytes));
    // Two tensors inside one allocation at odd offsets: the IPC handle
    // opens at the allocation base, so offsets must be applied.
    char* send = arena + 1000003 + 2 * round;
    char* recv = arena + 5000011 + round;
    if (!Ok(e.c, e.c.Register(send, count), "register send") ||
        !Ok(e.c, e.c.Register(recv, count * e.world), "register recv"))
      return 1;
    for (int v = 0; v < 3; ++v) {
      bad += CheckVariant(e, send, recv, DMAGATHER_INT8, count, kVariants[v], 7000 + round * 10 + v,
                          "suballoc round " + std::to_string(round) + " variant " + std::to_string(v));
    }
    // Free and allocate again: the address range is often reused, and the
    // client must notice (buffer id) and register the new allocation.
    CK(cudaFree(arena));
  }
  return bad != 0;
}

int ModeStream(Env& e) {
  const size_t count = (4 << 20) / 4 + 5;  // float32
  const size_t shard = count * 4;
  char* send = Alloc(e, shard);
  char* recv = Alloc(e, shard * e.world);
  if (!send || !recv) return 1;
  // DMAGATHER_TEST_STREAM_ITERS: a longer run (tests/gpu/run.sh restart
  // restarts the daemon under it).
  const char* it = getenv("DMAGATHER_TEST_STREAM_ITERS");
  const int iters = it != nullptr && atoi(it) > 0 ? atoi(it) : 300;
  // Everything below is enqueued without a host synchronisation: the
  // producer writes this iteration's shard, the allgather's ready write
  // follows it on the stream, the consumer checks after the done wait.
  for (int i = 0; i < iters; ++i) {
    char* in = (i % 2) == 1 ? recv + e.rank * shard : send;                 // Odd iterations in place.
    if (i % 7 == 0) dmagather::kernels::Delay(50'000 * (e.rank + 1), e.s);  // Ready comes late, unevenly.
    dmagather::kernels::FillPattern(in, shard, 90000 + i, e.rank, e.s);
    if (!Ok(e.c, e.c.AllGather(in, recv, count, DMAGATHER_FLOAT32, e.s), "allgather " + std::to_string(i))) return 1;
    e.ck.CompareShards(recv, shard, e.world, 90000 + i, e.s);
  }
  unsigned long long first = 0;
  const unsigned long long bad = e.ck.Read(e.s, &first);
  if (!Ok(e.c, e.c.Wait(), "wait")) return 1;
  if (e.rank == 0) printf("  stream: %d iterations x %d shards, %llu wrong words (rank 0)\n", iters, e.world, bad);
  return NoWrongWords(e, bad, first, "with stream ordering");
}

int ModeEight(Env& e) {
  const size_t count = (1 << 20) + 7;
  char* send = Alloc(e, count * 4);
  char* recv = Alloc(e, count * 4 * e.world);
  if (!send || !recv) return 1;
  struct Check {
    dmagather_dtype_t dt;
    const Variant& v;
    uint64_t seed;
    const char* label;
  };
  const Check checks[] = {{DMAGATHER_FLOAT32, kVariants[0], 51, "eight float32 out-of-place"},
                          {DMAGATHER_BFLOAT16, kVariants[1], 52, "eight bfloat16 in-place"},
                          {DMAGATHER_FLOAT32, kVariants[2], 53, "eight float32 list"}};
  int bad = 0;
  for (const Check& k : checks) bad += CheckVariant(e, send, recv, k.dt, count, k.v, k.seed, k.label);
  return bad != 0;
}

double NowMs() { return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count(); }

int ModeKill(Env& e) {
  const size_t count = 1 << 20;
  char* recv = Alloc(e, count * e.world);
  if (!recv) return 1;
  char* own = recv + e.rank * count;
  for (int i = 0; i < 2; ++i) {
    if (!Ok(e.c, e.c.AllGather(own, recv, count, DMAGATHER_UINT8, e.s), "warm-up")) return 1;
  }
  CK(cudaStreamSynchronize(e.s));
  if (!Ok(e.c, e.c.Wait(), "warm-up wait")) return 1;
  if (e.rank == e.world - 1) {
    // Hold the stream back so the op's ready write never happens, submit,
    // then die with the daemon's streams waiting on this rank.
    dmagather::kernels::Delay(20'000'000'000ull, e.s);
    e.c.AllGather(own, recv, count, DMAGATHER_UINT8, e.s);
    sh->step[0].store(1);
    usleep(200'000);
    sh->kill_to_error_ms[7] = NowMs();
    raise(SIGKILL);
  }
  while (sh->step[0].load() == 0) usleep(1000);
  if (!Ok(e.c, e.c.AllGather(own, recv, count, DMAGATHER_UINT8, e.s), "op 3 submit")) return 1;
  dmagather_status_t st = e.c.Wait();
  const double now = NowMs();
  while (sh->kill_to_error_ms[7] == 0) usleep(100);
  double& ms = sh->kill_to_error_ms[e.rank];
  ms = now - sh->kill_to_error_ms[7];
  sh->status_seen[e.rank] = st;
  // The stream must drain (done was published with the error).
  if (cudaError_t q = DrainWithin(e.s, std::chrono::seconds(10)); q != cudaSuccess) {
    return FailRank(e, std::string("stream still blocked 10 s after the peer died (") + cudaGetErrorName(q) + ")");
  }
  if (st != DMAGATHER_PEER_FAILED) {
    return FailRank(e, std::string("wait returned ") + dmagather_status_string(st) + " (" + e.c.error() +
                           "), expected DMAGATHER_PEER_FAILED");
  }
  printf("  kill: rank %d got %s %.0f ms after the kill: %s\n", e.rank, dmagather_status_string(st), ms,
         e.c.error().c_str());
  if (ms > 1000) return FailRank(e, "peer failure reported after " + std::to_string(ms) + " ms (> 1 s)");
  return 0;
}

int ModeMismatch(Env& e) {
  char* recv = Alloc(e, 4096 * e.world);
  if (!recv) return 1;
  const size_t count = e.rank == 0 ? 100 : 101;
  if (!Ok(e.c, e.c.AllGather(recv + e.rank * count, recv, count, DMAGATHER_UINT8, e.s), "submit")) return 1;
  if (DrainWithin(e.s, std::chrono::seconds(10)) != cudaSuccess) {
    Fail("stream blocked after a failed op");
    return 1;
  }
  dmagather_status_t st = e.c.Wait();
  if (st != DMAGATHER_INVALID_ARGUMENT) {
    return FailRank(e, std::string("wait returned ") + dmagather_status_string(st) + ", expected INVALID_ARGUMENT");
  }
  if (e.rank == 0) printf("  mismatch: %s: %s\n", dmagather_status_string(st), e.c.error().c_str());
  return 0;
}

int ModeOpHandles(Env& e) {
  const size_t count = (2 << 20) + 3;  // bfloat16
  const size_t shard = count * 2;
  char* send = Alloc(e, shard);
  char* recv = Alloc(e, shard * e.world);
  if (!send || !recv) return 1;
  cudaStream_t producer, consumer;
  CK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  cudaEvent_t checked;
  CK(cudaEventCreateWithFlags(&checked, cudaEventDisableTiming));
  const int iters = 100;
  std::vector<dmagather_op_t> ops;
  for (int i = 0; i < iters; ++i) {
    char* in = (i % 2) == 1 ? recv + e.rank * shard : send;  // Odd iterations in place.
    // The producer may not overwrite the output before the last check read it.
    CK(cudaStreamWaitEvent(producer, checked, 0));
    if (i % 9 == 0) dmagather::kernels::Delay(30'000 * (e.rank + 1), producer);
    dmagather::kernels::FillPattern(in, shard, 31000 + i, e.rank, producer);
    dmagather_op_t op = 0;
    if (!Ok(e.c, dmagather_allgather_async(e.c.get(), in, recv, count, DMAGATHER_BFLOAT16, producer, &op), "async"))
      return 1;
    if (!Ok(e.c, dmagather_op_wait_stream(e.c.get(), op, consumer), "op_wait_stream")) return 1;
    e.ck.CompareShards(recv, shard, e.world, 31000 + i, consumer);
    // The next fill overwrites inputs and outputs: it waits for this check
    // (which itself followed the done wait, so the daemon has read them).
    CK(cudaEventRecord(checked, consumer));
    ops.push_back(op);
  }
  unsigned long long first = 0;
  const unsigned long long bad = e.ck.Read(consumer, &first);
  for (dmagather_op_t op : ops) {
    int done = 0;
    dmagather_status_t st = dmagather_op_test(e.c.get(), op, &done);
    if (st != DMAGATHER_OK || done != 1) {
      return FailRank(
          e, "op_test(" + std::to_string(op) + ") = " + dmagather_status_string(st) + " done=" + std::to_string(done));
    }
  }
  if (!Ok(e.c, dmagather_op_wait(e.c.get(), ops.back()), "op_wait")) return 1;
  if (e.rank == 0)
    printf("  ophandles: %d ops, consumer stream != producer stream, %llu wrong words (rank 0)\n", iters, bad);
  return NoWrongWords(e, bad, first, "with op handles");
}

int ModeCoalesced(Env& e) {
  struct T {
    dmagather_dtype_t dt;
    size_t count;
    bool in_place;
    char *send, *recv;
    size_t shard() const { return count * dmagather_dtype_size(dt); }
  };
  T ts[4] = {{DMAGATHER_BFLOAT16, (1 << 20) + 1, true},
             {DMAGATHER_FLOAT32, 4095, false},
             {DMAGATHER_UINT8, 3, true},
             {DMAGATHER_FLOAT64, (1 << 18) + 7, false}};
  for (T& t : ts) {
    t.send = Alloc(e, t.shard());
    t.recv = Alloc(e, t.shard() * e.world);
    if (!t.send || !t.recv) return 1;
  }
  for (int i = 0; i < 20; ++i) {
    dmagather_gather_t items[4];
    for (int k = 0; k < 4; ++k) {
      char* in = ts[k].in_place ? ts[k].recv + e.rank * ts[k].shard() : ts[k].send;
      CK(cudaMemsetAsync(ts[k].recv, 0x5A, ts[k].shard() * e.world, e.s));
      dmagather::kernels::FillPattern(in, ts[k].shard(), 50000 + 10 * i + k, e.rank, e.s);
      items[k] = dmagather_gather_t{in, ts[k].recv, ts[k].count, ts[k].dt};
    }
    dmagather_op_t op = 0;
    if (!Ok(e.c, dmagather_allgather_coalesced(e.c.get(), items, 4, e.s, &op), "coalesced")) return 1;
    if (!Ok(e.c, dmagather_op_wait_stream(e.c.get(), op, e.s), "op_wait_stream")) return 1;
    for (int k = 0; k < 4; ++k) e.ck.CompareShards(ts[k].recv, ts[k].shard(), e.world, 50000 + 10 * i + k, e.s);
  }
  unsigned long long first = 0;
  const unsigned long long bad = e.ck.Read(e.s, &first);
  if (!Ok(e.c, e.c.Wait(), "wait")) return 1;
  if (e.rank == 0) printf("  coalesced: 20 ops x 4 tensors, %llu wrong words (rank 0)\n", bad);
  return NoWrongWords(e, bad, first, "in coalesced ops");
}

int ModeFallback(Env& e) {
  const size_t count = 1 << 16;
  char* send = Alloc(e, count);
  char* recv = Alloc(e, count * e.world);
  if (!send || !recv) return 1;
  std::vector<char> host(count * e.world, 7);
  void* out = e.rank == 1 ? static_cast<void*>(host.data()) : recv;
  const auto t0 = Clock::now();
  std::string why;
  if (ExpectFallbackOfRank1(e, send, recv, out, count, 777, "host output", "", &why)) return 1;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (ms > 1000) {
    Fail("fallback verdict took " + std::to_string(ms) + " ms");
    return 1;
  }
  // Nothing was copied: every other rank's shard of the output is still
  // the 0x33 sentinel (the daemon never ran the op).
  std::vector<unsigned char> got(count * e.world);
  CK(cudaStreamSynchronize(e.s));
  CK(cudaMemcpy(got.data(), recv, got.size(), cudaMemcpyDeviceToHost));
  for (int r = 0; r < e.world && e.rank != 1; ++r) {
    if (r == e.rank) continue;
    for (size_t i = 0; i < count; ++i) {
      if (got[r * count + i] != 0x33) return FailRank(e, "shard " + std::to_string(r) + " was written by a failed op");
    }
  }
  if (e.rank == 0) printf("  fallback: every rank got FALLBACK in %.1f ms: %s\n", ms, why.c_str());
  // The job goes on: the next op is bit-exact.
  return CheckGather(e, Gather{send, recv, count, DMAGATHER_UINT8, false, 778, "after fallback"});
}

// --- VMM memory ---

const dmagather::common::cuda::DriverApi* Drv() {
  auto d = dmagather::common::cuda::Driver();
  return d.ok() ? *d : nullptr;
}

// A reserved range with `chunks` physical allocations of `chunk` bytes
// mapped back to back (as an expandable segment).
struct VmmArena {
  CUdeviceptr va = 0;
  size_t reserved = 0, chunk = 0;
  int device = 0;
  bool shareable = true;
  std::vector<CUmemGenericAllocationHandle> handles;  // 0 = not mapped.
  int Create(size_t max_chunks, size_t chunk_bytes, size_t mapped, bool share) {
    const auto* d = Drv();
    if (d == nullptr) {
      Fail("no driver");
      return 1;
    }
    CK(cudaGetDevice(&device));
    chunk = chunk_bytes;
    shareable = share;
    reserved = max_chunks * chunk;
    if (d->cuMemAddressReserve(&va, reserved, chunk, 0, 0) != CUDA_SUCCESS) {
      Fail("cuMemAddressReserve");
      return 1;
    }
    handles.assign(max_chunks, 0);
    for (size_t i = 0; i < mapped; ++i) {
      if (Map(i)) return 1;
    }
    return 0;
  }
  int Map(size_t i) {
    const auto* d = Drv();
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = shareable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    CUmemGenericAllocationHandle h = 0;
    if (d->cuMemCreate(&h, chunk, &prop, 0) != CUDA_SUCCESS) {
      Fail("cuMemCreate");
      return 1;
    }
    if (d->cuMemMap(va + i * chunk, chunk, 0, h, 0) != CUDA_SUCCESS) {
      Fail("cuMemMap");
      return 1;
    }
    CUmemAccessDesc a;
    memset(&a, 0, sizeof(a));
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = device;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (d->cuMemSetAccess(va + i * chunk, chunk, &a, 1) != CUDA_SUCCESS) {
      Fail("cuMemSetAccess");
      return 1;
    }
    handles[i] = h;
    return 0;
  }
  int Unmap(size_t i) {
    const auto* d = Drv();
    if (d->cuMemUnmap(va + i * chunk, chunk) != CUDA_SUCCESS) {
      Fail("cuMemUnmap");
      return 1;
    }
    d->cuMemRelease(handles[i]);
    handles[i] = 0;
    return 0;
  }
  char* at(size_t off) const { return reinterpret_cast<char*>(va) + off; }
};

// One flat uint8 AllGather of `shard` bytes between arbitrary device
// pointers, checked bit-exact.
int GatherBytes(Env& e, char* in, char* recv, size_t shard, uint64_t seed, const std::string& label) {
  return CheckGather(e, Gather{in, recv, shard, DMAGATHER_UINT8, false, seed, label});
}

int ModeVmm(Env& e) {
  const size_t chunk = 2 << 20;
  VmmArena in, out;
  // Inputs: 4 chunks; outputs: up to 12 chunks, 8 mapped at first.
  if (in.Create(4, chunk, 4, true) || out.Create(12, chunk, 8, true)) return 1;
  const size_t shard = (3 << 20) + 12345;   // Spans 2-3 chunks wherever it starts.
  const size_t in_off = (1 << 20) + 333;    // Inside chunk 0, runs into chunk 2.
  const size_t out_off = (1 << 20) + 4097;  // Output: world * shard from here.
  if (out_off + e.world * shard > 8 * chunk) {
    Fail("layout");
    return 1;
  }
  int bad = 0;
  for (int i = 0; i < 20; ++i) {  // Out of place, then in place, alternating.
    char* recv = out.at(out_off);
    char* src = (i % 2 == 0) ? in.at(in_off) : recv + e.rank * shard;
    bad += GatherBytes(e, src, recv, shard, 5000 + i, "vmm step " + std::to_string(i));
  }
  // Host cost of the per-submit validity check of a registration (one
  // pointer attribute per chunk under the range): dmagather_register of
  // already registered VMM memory vs cudaMalloc memory.
  char* plain = Alloc(e, e.world * shard);
  if (plain == nullptr) return 1;
  auto time_register = [&](char* p) {
    const auto t0 = Clock::now();
    for (int k = 0; k < 2000; ++k) e.c.Register(p, e.world * shard);
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2000;
  };
  const double us_plain = time_register(plain), us_vmm = time_register(out.at(out_off));
  // Remap: the chunk under rank 1's output shard gets new physical memory at
  // the same address (what an allocator does after empty_cache and regrowth).
  cudaStreamSynchronize(e.s);
  StartLine(e);
  const size_t remap_chunk = (out_off + 1 * shard) / chunk;
  if (out.Unmap(remap_chunk) || out.Map(remap_chunk)) return 1;
  for (int i = 0; i < 4; ++i) {
    bad += GatherBytes(e, in.at(in_off), out.at(out_off), shard, 6000 + i, "after remap " + std::to_string(i));
  }
  // Growth: map chunks 8..11 and gather into a range that reaches them.
  for (size_t k = 8; k < 12; ++k) {
    if (out.Map(k)) return 1;
  }
  const size_t grown_off = 6 * chunk + 777;
  const size_t grown_shard = (12 * chunk - grown_off) / e.world - 5;
  VmmArena big_in;
  if (big_in.Create(5, chunk, 5, true)) return 1;
  bad += GatherBytes(e, big_in.at(3), out.at(grown_off), grown_shard, 7000, "grown range");
  bad += GatherBytes(e, big_in.at(3), out.at(grown_off), grown_shard, 7001, "grown range again");
  if (e.rank == 0) {
    printf(
        "  vmm: 2 MiB chunks, shard %zu B spanning chunks; 20 steps + 4 after a remap + 2 over grown range, %d "
        "failed on rank 0; per-submit registration check: %.2f us (VMM, %zu chunks) vs %.2f us (cudaMalloc)\n",
        shard, bad, us_vmm, (out_off % chunk + e.world * shard + chunk - 1) / chunk, us_plain);
  }
  return bad != 0;
}

int ModeVmmUnshareable(Env& e) {
  const size_t chunk = 2 << 20, shard = (1 << 20) + 99;
  VmmArena out;
  if (out.Create(4, chunk, 4, /*share=*/e.rank != 1)) return 1;
  char* send = Alloc(e, shard);
  if (send == nullptr) return 1;
  std::string why;
  if (ExpectFallbackOfRank1(e, send, out.at(0), out.at(0), shard, 31, "unshareable VMM output", "shareable handle",
                            &why))
    return 1;
  CK(cudaStreamSynchronize(e.s));
  if (e.rank == 0) printf("  vmm_unshareable: every rank got FALLBACK: %s\n", why.c_str());
  char* recv = Alloc(e, shard * e.world);
  if (recv == nullptr) return 1;
  return GatherBytes(e, send, recv, shard, 32, "after fallback");
}

// --- CUDA graph capture ---

// Ends the capture on e.s and instantiates it; fails ("rank R: what: the
// error") when the captured AllGather(s) did not return OK, or CUDA refused.
int EndCaptureAndInstantiate(Env& e, bool captured_ok, const std::string& what, cudaGraph_t* graph,
                             cudaGraphExec_t* exec) {
  cudaError_t end = cudaStreamEndCapture(e.s, graph);
  if (!captured_ok) return FailRank(e, what + ": " + e.c.error());
  CK(end);
  CK(cudaGraphInstantiate(exec, *graph, 0));
  return 0;
}

// Graph slots come back when their graphs are destroyed: `graphs` graphs
// (more than the 32 slots) captured, replayed twice, checked and destroyed
// in turn.
int GraphSlotsComeBack(Env& e, char* recv_b, size_t shard_b, int graphs) {
  for (int k = 0; k < graphs; ++k) {
    const uint64_t seed = 9000 + k;
    char* own = recv_b + e.rank * shard_b;
    CK(cudaStreamBeginCapture(e.s, cudaStreamCaptureModeGlobal));
    dmagather::kernels::FillPattern(own, shard_b, seed, e.rank, e.s);
    dmagather_status_t st = e.c.AllGather(own, recv_b, shard_b, DMAGATHER_UINT8, e.s);
    e.ck.CompareShards(recv_b, shard_b, e.world, seed, e.s);
    cudaGraph_t g = nullptr;
    cudaGraphExec_t x = nullptr;
    const std::string what = "capture " + std::to_string(k) + ": " + dmagather_status_string(st);
    if (EndCaptureAndInstantiate(e, st == DMAGATHER_OK, what, &g, &x)) return 1;
    CK(cudaGraphLaunch(x, e.s));
    CK(cudaGraphLaunch(x, e.s));
    unsigned long long first = 0;
    const unsigned long long wrong = e.ck.Read(e.s, &first);
    if (wrong != 0) return FailRank(e, "graph " + std::to_string(k) + ": " + std::to_string(wrong) + " wrong words");
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
    CK(cudaDeviceSynchronize());
    usleep(2000);  // The slot's user object is released on a CUDA thread.
  }
  return 0;
}

int ModeGraph(Env& e) {
  const int rank = e.rank, world = e.world;
  cudaStream_t s = e.s;
  const size_t shard_a = (2 << 20) + 4104, shard_b = 65536 + 40;  // Bytes (uint8 / float32 counts below).
  char* send = Alloc(e, shard_a);
  char* recv_a = Alloc(e, shard_a * world);
  char* recv_b = Alloc(e, shard_b * world);
  if (!send || !recv_a || !recv_b) return 1;
  unsigned long long* d = nullptr;  // [0] step, [1] mismatches, [2] first bad
  CK(cudaMalloc(&d, 24));
  unsigned long long init[3] = {1000, 0, ~0ull};
  CK(cudaMemcpy(d, init, sizeof(init), cudaMemcpyHostToDevice));
  // Capture: step++ -> fill inputs (seed = step) -> gather A (out of place)
  // and B (in place) -> check every shard of both outputs.
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  dmagather::kernels::Increment(d, s);
  dmagather::kernels::FillPatternDeviceSeed(send, shard_a, d, rank, s);
  dmagather::kernels::FillPatternDeviceSeed(recv_b + rank * shard_b, shard_b, d, rank + 100, s);
  dmagather_status_t st_a = e.c.AllGather(send, recv_a, shard_a, DMAGATHER_UINT8, s);
  dmagather_status_t st_b = e.c.AllGather(recv_b + rank * shard_b, recv_b, shard_b / 4, DMAGATHER_FLOAT32, s);
  for (int r = 0; r < world; ++r) {
    dmagather::kernels::ComparePatternDeviceSeed(recv_a + r * shard_a, shard_a, d, r, d + 1, d + 2, s);
    dmagather::kernels::ComparePatternDeviceSeed(recv_b + r * shard_b, shard_b, d, r + 100, d + 1, d + 2, s);
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  const std::string captured =
      std::string("captured allgather returned ") + dmagather_status_string(st_a) + "/" + dmagather_status_string(st_b);
  if (EndCaptureAndInstantiate(e, st_a == DMAGATHER_OK && st_b == DMAGATHER_OK, captured, &graph, &exec)) return 1;
  // Every rank holds off until all have instantiated (no host sync of the
  // stream below, only this start line).
  StartLine(e);
  // DMAGATHER_TEST_GRAPH_REPLAYS: a longer run (tests/gpu/run.sh restart
  // restarts the daemon under it).
  const char* want = getenv("DMAGATHER_TEST_GRAPH_REPLAYS");
  const int replays = want != nullptr && atoi(want) > 0 ? atoi(want) : 100;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, s));
  for (int i = 0; i < replays; ++i) {
    if (i % 17 == 0) dmagather::kernels::Delay(30'000 * (rank + 1), s);  // Ranks replay unevenly.
    CK(cudaGraphLaunch(exec, s));
  }
  CK(cudaEventRecord(e1, s));
  CK(cudaStreamSynchronize(s));
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  unsigned long long h[3];
  CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
  if (h[0] != 1000 + replays || h[1] != 0) {
    return FailRank(e, "after " + std::to_string(replays) + " replays step=" + std::to_string(h[0]) + ", " +
                           std::to_string(h[1]) + " wrong words (first at byte " + std::to_string(h[2]) + ")");
  }
  if (rank == 0) {
    printf(
        "  graph: %d replays x 2 captured allgathers (%zu B and %zu B shards, %d ranks), 0 wrong words; %.1f us "
        "per replay (incl. fill/check kernels and injected delays)\n",
        replays, shard_a, shard_b, world, ms * 1000 / replays);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  // The ordinary path still works after the graph.
  if (e.ck.Init()) return 1;
  if (GatherBytes(e, send, recv_a, shard_a, 8080, "ordinary op after the graph")) return 1;
  const int graphs = 40;
  if (GraphSlotsComeBack(e, recv_b, shard_b, graphs)) return 1;
  if (rank == 0) printf("  graph: %d more graphs captured, replayed and destroyed in turn (32 slots)\n", graphs);
  return 0;
}

// --- The table: each mode, its ranks, what its ranks start with ---

enum Setup : unsigned { kStream = 1, kChecker = 2 };

struct ModeSpec {
  const char* name;
  int world;
  unsigned setup;    // kStream | kChecker: made before the mode runs.
  int (*run)(Env&);  // One rank.
};

const ModeSpec kModes[] = {
    {"dtypes", 4, kStream | kChecker, ModeDtypes},
    {"suballoc", 3, kStream | kChecker, ModeSuballoc},
    {"stream", 4, kStream | kChecker, ModeStream},
    {"eight", 8, kStream | kChecker, ModeEight},
    {"kill", 3, kStream, ModeKill},
    {"mismatch", 2, kStream, ModeMismatch},
    {"ophandles", 3, kChecker, ModeOpHandles},
    {"coalesced", 3, kStream | kChecker, ModeCoalesced},
    {"fallback", 3, kStream | kChecker, ModeFallback},
    {"vmm", 3, kStream | kChecker, ModeVmm},
    {"vmm_unshareable", 3, kStream | kChecker, ModeVmmUnshareable},
    {"graph", 3, kStream, ModeGraph},  // Its checker is made after the graph.
};

// One rank of `m` (in its own process): joins the mode's job, makes what
// the mode starts with, runs it.
int RunRank(const ModeSpec& m, int rank, int world) {
  dmagather::Comm c(nullptr, Job(m.name), world, rank);
  if (!c.ok()) {
    Fail("init: " + c.error());
    return 1;
  }
  Env e{c, rank, world};
  if (m.setup & kStream) CK(cudaStreamCreateWithFlags(&e.s, cudaStreamNonBlocking));
  if ((m.setup & kChecker) && e.ck.Init()) {
    Fail("checker");
    return 1;
  }
  return m.run(e);
}

const ModeSpec* FindMode(const std::string& name) {
  for (const ModeSpec& m : kModes) {
    if (name == m.name) return &m;
  }
  return nullptr;
}

// kill: exactly the killed rank ends abnormally; then the daemon serves a
// new job (2 ranks of "eight").
int KillVerdict(int dead) {
  int bad = dead == 1 ? 0 : 1;
  if (dead != 1 && sh->failures.load() == 0) Fail(std::to_string(dead) + " rank(s) ended abnormally, expected 1");
  if (bad == 0) {
    int second = dmagather::testing::LaunchRanks(2, [](int r, int w) { return RunRank(*FindMode("eight"), r, w); });
    if (second != 0) {
      bad = 1;
      Fail("second job after the kill failed");
    } else {
      printf("  kill: a second job ran correctly afterwards\n");
    }
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  const ModeSpec* m = FindMode(mode);
  if (m == nullptr) {
    std::string names;
    for (const ModeSpec& k : kModes) names += (names.empty() ? "" : "|") + std::string(k.name);
    fprintf(stderr, "usage: allgather_gpu_test %s\n", names.c_str());
    return 2;
  }
  sh = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (sh) Shared();
  int bad = dmagather::testing::LaunchRanks(m->world, [m](int r, int w) { return RunRank(*m, r, w); });
  if (mode == "kill") bad = KillVerdict(bad);
  if (bad != 0 || sh->failures.load() != 0) {
    printf("FAIL %s: %s\n", mode.c_str(), sh->why[0] ? sh->why : "a rank failed");
    return 1;
  }
  printf("PASS %s\n", mode.c_str());
  return 0;
}

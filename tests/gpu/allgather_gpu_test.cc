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
//             100 times with no host synchronisation between replays: every
//             replay bit-exact on every rank; then an ordinary op
#include <cuda.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/cuda/cuda_api.h"
#include "dmagather/client.h"
#include "kernels/verify.h"

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

std::vector<std::string> SplitCommas(const char* text) {
  std::vector<std::string> list;
  for (const char *p = text, *q; *p != '\0'; p = *q ? q + 1 : q) {
    q = strchr(p, ',');
    if (q == nullptr) q = p + strlen(p);
    list.emplace_back(p, q);
  }
  return list;
}

// Runs fn(rank, world) in `world` processes; returns how many failed.
int Launch(int world, const std::function<int(int, int)>& fn) {
  std::vector<pid_t> kids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      // Multi-node check (run.sh): DMAGATHER_TEST_SOCKETS lists one daemon
      // per simulated node; rank r joins node r % n (interleaved), and the
      // library takes the job id from DMAGATHER_JOB_ID.
      if (const char* socks = getenv("DMAGATHER_TEST_SOCKETS"); socks != nullptr && *socks != '\0') {
        const std::vector<std::string> list = SplitCommas(socks);
        setenv("DMAGATHER_SOCKET", list[r % list.size()].c_str(), 1);
      }
      // Per-rank visibility (run.sh, the design case of one GPU per rank):
      // DMAGATHER_TEST_RANK_VISIBLE lists GPUs (UUIDs or indices); rank r
      // sees only entry r % n, as under SLURM --gpus-per-task or a device
      // plugin, so every rank calls its GPU device 0 and the daemon must map
      // it by identity. Set before this process's first CUDA call.
      if (const char* vis = getenv("DMAGATHER_TEST_RANK_VISIBLE"); vis != nullptr && *vis != '\0') {
        const std::vector<std::string> list = SplitCommas(vis);
        setenv("CUDA_VISIBLE_DEVICES", list[r % list.size()].c_str(), 1);
      }
      // One rank per GPU where there are several (ranks share GPUs round-robin).
      int devices = 0;
      if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 1) cudaSetDevice(r % devices);
      const int rc = fn(r, world);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    kids.push_back(pid);
  }
  int bad = 0;
  for (pid_t p : kids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++bad;
  }
  return bad;
}

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
  // Syncs the stream and returns the mismatch count (first offset in *first).
  unsigned long long Read(cudaStream_t s, unsigned long long* first) {
    unsigned long long h[2] = {~0ull, ~0ull};
    if (cudaStreamSynchronize(s) != cudaSuccess || cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost) != cudaSuccess)
      return ~0ull;
    if (first) *first = h[1];
    return h[0];
  }
};

bool Ok(dmagather::Comm& c, dmagather_status_t st, const std::string& what) {
  if (st == DMAGATHER_OK) return true;
  Fail("rank " + std::to_string(c.rank()) + " " + what + ": " + dmagather_status_string(st) + ": " + c.error());
  return false;
}

// One checked AllGather. variant 0: out of place, 1: in place, 2: list.
// recv holds world*bytes; send holds bytes (unused in place).
int CheckOne(dmagather::Comm& c, Checker& ck, cudaStream_t s, char* send, char* recv, dmagather_dtype_t dt,
             size_t count, int variant, uint64_t seed, const std::string& label) {
  const int world = c.size(), rank = c.rank();
  const size_t shard = count * dmagather_dtype_size(dt);
  char* own = recv + rank * shard;
  char* in = variant == 1 ? own : send;
  CK(cudaMemsetAsync(recv, 0xA5, shard * world, s));  // Poison.
  if (dmagather::kernels::FillPattern(in, shard, seed, rank, s) != 0) {
    Fail("fill");
    return 1;
  }
  dmagather_status_t st;
  if (variant == 2) {
    std::vector<void*> outs(world);
    for (int r = 0; r < world; ++r) outs[r] = recv + r * shard;
    st = c.AllGatherList(in, outs, count, dt, s);
  } else {
    st = c.AllGather(in, recv, count, dt, s);
  }
  if (!Ok(c, st, label + " submit")) return 1;
  for (int r = 0; r < world; ++r) ck.Compare(recv + r * shard, shard, seed, r, s);
  unsigned long long first = 0;
  unsigned long long bad = ck.Read(s, &first);
  if (!Ok(c, c.Wait(), label + " wait")) return 1;
  if (bad != 0) {
    Fail("rank " + std::to_string(rank) + " " + label + ": " + std::to_string(bad) + " wrong words, first at byte " +
         std::to_string(first) + " (shard of rank " + std::to_string(shard ? first / shard : 0) + ")");
    ck.Reset(s);
    return 1;
  }
  return 0;
}

int ModeDtypes(int rank, int world) {
  dmagather::Comm c(nullptr, Job("dtypes"), world, rank);
  if (!c.ok()) {
    Fail("init: " + c.error());
    return 1;
  }
  if (c.backend() != "cuda") {
    Fail("backend is " + c.backend());
    return 1;
  }
  const size_t max_shard = size_t(256) << 20;
  char* send = static_cast<char*>(c.Alloc(max_shard));
  char* recv = static_cast<char*>(c.Alloc(max_shard * world));
  if (!send || !recv) {
    Fail("alloc: " + c.error());
    return 1;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Checker ck;
  if (ck.Init()) {
    Fail("checker");
    return 1;
  }
  int bad = 0;
  uint64_t seed = 1000;
  for (int d = 0; d < DMAGATHER_NUM_DTYPES; ++d) {
    const auto dt = static_cast<dmagather_dtype_t>(d);
    const size_t es = dmagather_dtype_size(dt);
    for (size_t count : {size_t(1), size_t(3), size_t(4095), size_t((1 << 20) + 7), max_shard / es}) {
      for (int v = 0; v < 3; ++v) {
        std::string label = std::string(dmagather_dtype_name(dt)) + " count=" + std::to_string(count) +
                            (v == 0   ? " out-of-place"
                             : v == 1 ? " in-place"
                                      : " list");
        bad += CheckOne(c, ck, s, send, recv, dt, count, v, ++seed, label);
      }
    }
  }
  if (rank == 0) printf("  dtypes: %d checks per rank, %d failed on rank 0\n", DMAGATHER_NUM_DTYPES * 5 * 3, bad);
  return bad != 0;
}

int ModeSuballoc(int rank, int world) {
  dmagather::Comm c(nullptr, Job("suballoc"), world, rank);
  if (!c.ok()) {
    Fail("init: " + c.error());
    return 1;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Checker ck;
  if (ck.Init()) return 1;
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
    if (!Ok(c, c.Register(send, count), "register send") || !Ok(c, c.Register(recv, count * world), "register recv"))
      return 1;
    for (int v = 0; v < 3; ++v) {
      bad += CheckOne(c, ck, s, send, recv, DMAGATHER_INT8, count, v, 7000 + round * 10 + v,
                      "suballoc round " + std::to_string(round) + " variant " + std::to_string(v));
    }
    // Free and allocate again: the address range is often reused, and the
    // client must notice (buffer id) and register the new allocation.
    CK(cudaFree(arena));
  }
  return bad != 0;
}

int ModeStream(int rank, int world) {
  dmagather::Comm c(nullptr, Job("stream"), world, rank);
  if (!c.ok()) {
    Fail("init: " + c.error());
    return 1;
  }
  const size_t count = (4 << 20) / 4 + 5;  // float32
  const size_t shard = count * 4;
  char* send = static_cast<char*>(c.Alloc(shard));
  char* recv = static_cast<char*>(c.Alloc(shard * world));
  if (!send || !recv) {
    Fail("alloc: " + c.error());
    return 1;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Checker ck;
  if (ck.Init()) return 1;
  const int iters = 300;
  // Everything below is enqueued without a host synchronisation: the
  // producer writes this iteration's shard, the allgather's ready write
  // follows it on the stream, the consumer checks after the done wait.
  for (int i = 0; i < iters; ++i) {
    const bool in_place = (i % 2) == 1;
    char* in = in_place ? recv + rank * shard : send;
    if (i % 7 == 0) dmagather::kernels::Delay(50'000 * (rank + 1), s);  // Ready comes late, unevenly.
    dmagather::kernels::FillPattern(in, shard, 90000 + i, rank, s);
    if (!Ok(c, c.AllGather(in, recv, count, DMAGATHER_FLOAT32, s), "allgather " + std::to_string(i))) return 1;
    for (int r = 0; r < world; ++r) ck.Compare(recv + r * shard, shard, 90000 + i, r, s);
  }
  unsigned long long first = 0;
  unsigned long long bad = ck.Read(s, &first);
  if (!Ok(c, c.Wait(), "wait")) return 1;
  if (rank == 0) printf("  stream: %d iterations x %d shards, %llu wrong words (rank 0)\n", iters, world, bad);
  if (bad != 0) {
    Fail("rank " + std::to_string(rank) + ": " + std::to_string(bad) + " wrong words with stream ordering");
    return 1;
  }
  return 0;
}

int ModeEight(int rank, int world) {
  dmagather::Comm c(nullptr, Job("eight"), world, rank);
  if (!c.ok()) {
    Fail("init: " + c.error());
    return 1;
  }
  const size_t count = (1 << 20) + 7;
  char* send = static_cast<char*>(c.Alloc(count * 4));
  char* recv = static_cast<char*>(c.Alloc(count * 4 * world));
  if (!send || !recv) {
    Fail("alloc: " + c.error());
    return 1;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Checker ck;
  if (ck.Init()) return 1;
  int bad = 0;
  bad += CheckOne(c, ck, s, send, recv, DMAGATHER_FLOAT32, count, 0, 51, "eight float32 out-of-place");
  bad += CheckOne(c, ck, s, send, recv, DMAGATHER_BFLOAT16, count, 1, 52, "eight bfloat16 in-place");
  bad += CheckOne(c, ck, s, send, recv, DMAGATHER_FLOAT32, count, 2, 53, "eight float32 list");
  return bad != 0;
}

int ModeKill(int rank, int world) {
  dmagather::Comm c(nullptr, Job("kill"), world, rank);
  if (!c.ok()) {
    Fail("init: " + c.error());
    return 1;
  }
  const size_t count = 1 << 20;
  char* recv = static_cast<char*>(c.Alloc(count * world));
  if (!recv) {
    Fail("alloc: " + c.error());
    return 1;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < 2; ++i) {
    if (!Ok(c, c.AllGather(recv + rank * count, recv, count, DMAGATHER_UINT8, s), "warm-up")) return 1;
  }
  CK(cudaStreamSynchronize(s));
  if (!Ok(c, c.Wait(), "warm-up wait")) return 1;
  if (rank == world - 1) {
    // Hold the stream back so the op's ready write never happens, submit,
    // then die with the daemon's streams waiting on this rank.
    dmagather::kernels::Delay(20'000'000'000ull, s);
    c.AllGather(recv + rank * count, recv, count, DMAGATHER_UINT8, s);
    sh->step[0].store(1);
    usleep(200'000);
    sh->kill_to_error_ms[7] = std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
    raise(SIGKILL);
  }
  while (sh->step[0].load() == 0) usleep(1000);
  if (!Ok(c, c.AllGather(recv + rank * count, recv, count, DMAGATHER_UINT8, s), "op 3 submit")) return 1;
  dmagather_status_t st = c.Wait();
  const double now = std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
  while (sh->kill_to_error_ms[7] == 0) usleep(100);
  sh->kill_to_error_ms[rank] = now - sh->kill_to_error_ms[7];
  sh->status_seen[rank] = st;
  // The stream must drain (done was published with the error).
  auto t0 = Clock::now();
  cudaError_t q;
  while ((q = cudaStreamQuery(s)) == cudaErrorNotReady && Clock::now() - t0 < std::chrono::seconds(10)) usleep(1000);
  if (q != cudaSuccess) {
    Fail("rank " + std::to_string(rank) + ": stream still blocked 10 s after the peer died (" + cudaGetErrorName(q) +
         ")");
    return 1;
  }
  if (st != DMAGATHER_PEER_FAILED) {
    Fail("rank " + std::to_string(rank) + ": wait returned " + dmagather_status_string(st) + " (" + c.error() +
         "), expected DMAGATHER_PEER_FAILED");
    return 1;
  }
  printf("  kill: rank %d got %s %.0f ms after the kill: %s\n", rank, dmagather_status_string(st),
         sh->kill_to_error_ms[rank], c.error().c_str());
  if (sh->kill_to_error_ms[rank] > 1000) {
    Fail("rank " + std::to_string(rank) + ": peer failure reported after " +
         std::to_string(sh->kill_to_error_ms[rank]) + " ms (> 1 s)");
    return 1;
  }
  return 0;
}

int ModeMismatch(int rank, int world) {
  dmagather::Comm c(nullptr, Job("mismatch"), world, rank);
  if (!c.ok()) {
    Fail("init: " + c.error());
    return 1;
  }
  char* recv = static_cast<char*>(c.Alloc(4096 * world));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t count = rank == 0 ? 100 : 101;
  if (!Ok(c, c.AllGather(recv + rank * count, recv, count, DMAGATHER_UINT8, s), "submit")) return 1;
  auto t0 = Clock::now();
  cudaError_t q;
  while ((q = cudaStreamQuery(s)) == cudaErrorNotReady && Clock::now() - t0 < std::chrono::seconds(10)) usleep(1000);
  if (q != cudaSuccess) {
    Fail("stream blocked after a failed op");
    return 1;
  }
  dmagather_status_t st = c.Wait();
  if (st != DMAGATHER_INVALID_ARGUMENT) {
    Fail("rank " + std::to_string(rank) + ": wait returned " + dmagather_status_string(st) +
         ", expected INVALID_ARGUMENT");
    return 1;
  }
  if (rank == 0) printf("  mismatch: %s: %s\n", dmagather_status_string(st), c.error().c_str());
  return 0;
}

int ModeOpHandles(int rank, int world) {
  dmagather::Comm c(nullptr, Job("ophandles"), world, rank);
  if (!c.ok()) {
    Fail("init: " + c.error());
    return 1;
  }
  const size_t count = (2 << 20) + 3;  // bfloat16
  const size_t shard = count * 2;
  char* send = static_cast<char*>(c.Alloc(shard));
  char* recv = static_cast<char*>(c.Alloc(shard * world));
  if (!send || !recv) {
    Fail("alloc: " + c.error());
    return 1;
  }
  cudaStream_t producer, consumer;
  CK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  cudaEvent_t checked;
  CK(cudaEventCreateWithFlags(&checked, cudaEventDisableTiming));
  Checker ck;
  if (ck.Init()) return 1;
  const int iters = 100;
  std::vector<dmagather_op_t> ops;
  for (int i = 0; i < iters; ++i) {
    const bool in_place = (i % 2) == 1;
    char* in = in_place ? recv + rank * shard : send;
    // The producer may not overwrite the output before the last check read it.
    CK(cudaStreamWaitEvent(producer, checked, 0));
    if (i % 9 == 0) dmagather::kernels::Delay(30'000 * (rank + 1), producer);
    dmagather::kernels::FillPattern(in, shard, 31000 + i, rank, producer);
    dmagather_op_t op = 0;
    if (!Ok(c, dmagather_allgather_async(c.get(), in, recv, count, DMAGATHER_BFLOAT16, producer, &op), "async"))
      return 1;
    if (!Ok(c, dmagather_op_wait_stream(c.get(), op, consumer), "op_wait_stream")) return 1;
    for (int r = 0; r < world; ++r) ck.Compare(recv + r * shard, shard, 31000 + i, r, consumer);
    // The next fill overwrites inputs and outputs: it waits for this check
    // (which itself followed the done wait, so the daemon has read them).
    CK(cudaEventRecord(checked, consumer));
    ops.push_back(op);
  }
  unsigned long long first = 0;
  unsigned long long bad = ck.Read(consumer, &first);
  for (dmagather_op_t op : ops) {
    int done = 0;
    dmagather_status_t st = dmagather_op_test(c.get(), op, &done);
    if (st != DMAGATHER_OK || done != 1) {
      Fail("rank " + std::to_string(rank) + ": op_test(" + std::to_string(op) + ") = " + dmagather_status_string(st) +
           " done=" + std::to_string(done));
      return 1;
    }
  }
  if (!Ok(c, dmagather_op_wait(c.get(), ops.back()), "op_wait")) return 1;
  if (rank == 0)
    printf("  ophandles: %d ops, consumer stream != producer stream, %llu wrong words (rank 0)\n", iters, bad);
  if (bad != 0) {
    Fail("rank " + std::to_string(rank) + ": " + std::to_string(bad) + " wrong words with op handles, first at " +
         std::to_string(first));
    return 1;
  }
  return 0;
}

int ModeCoalesced(int rank, int world) {
  dmagather::Comm c(nullptr, Job("coalesced"), world, rank);
  if (!c.ok()) {
    Fail("init: " + c.error());
    return 1;
  }
  struct T {
    dmagather_dtype_t dt;
    size_t count;
    bool in_place;
  };
  const T ts[4] = {{DMAGATHER_BFLOAT16, (1 << 20) + 1, true},
                   {DMAGATHER_FLOAT32, 4095, false},
                   {DMAGATHER_UINT8, 3, true},
                   {DMAGATHER_FLOAT64, (1 << 18) + 7, false}};
  char* send[4];
  char* recv[4];
  for (int k = 0; k < 4; ++k) {
    const size_t shard = ts[k].count * dmagather_dtype_size(ts[k].dt);
    send[k] = static_cast<char*>(c.Alloc(shard));
    recv[k] = static_cast<char*>(c.Alloc(shard * world));
    if (!send[k] || !recv[k]) {
      Fail("alloc: " + c.error());
      return 1;
    }
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Checker ck;
  if (ck.Init()) return 1;
  for (int i = 0; i < 20; ++i) {
    dmagather_gather_t items[4];
    for (int k = 0; k < 4; ++k) {
      const size_t shard = ts[k].count * dmagather_dtype_size(ts[k].dt);
      char* in = ts[k].in_place ? recv[k] + rank * shard : send[k];
      CK(cudaMemsetAsync(recv[k], 0x5A, shard * world, s));
      dmagather::kernels::FillPattern(in, shard, 50000 + 10 * i + k, rank, s);
      items[k] = dmagather_gather_t{in, recv[k], ts[k].count, ts[k].dt};
    }
    dmagather_op_t op = 0;
    if (!Ok(c, dmagather_allgather_coalesced(c.get(), items, 4, s, &op), "coalesced")) return 1;
    if (!Ok(c, dmagather_op_wait_stream(c.get(), op, s), "op_wait_stream")) return 1;
    for (int k = 0; k < 4; ++k) {
      const size_t shard = ts[k].count * dmagather_dtype_size(ts[k].dt);
      for (int r = 0; r < world; ++r) ck.Compare(recv[k] + r * shard, shard, 50000 + 10 * i + k, r, s);
    }
  }
  unsigned long long first = 0;
  unsigned long long bad = ck.Read(s, &first);
  if (!Ok(c, c.Wait(), "wait")) return 1;
  if (rank == 0) printf("  coalesced: 20 ops x 4 tensors, %llu wrong words (rank 0)\n", bad);
  if (bad != 0) {
    Fail("rank " + std::to_string(rank) + ": " + std::to_string(bad) + " wrong words in coalesced ops");
    return 1;
  }
  return 0;
}

int ModeFallback(int rank, int world) {
  dmagather::Comm c(nullptr, Job("fallback"), world, rank);
  if (!c.ok()) {
    Fail("init: " + c.error());
    return 1;
  }
  const size_t count = 1 << 16;
  char* send = static_cast<char*>(c.Alloc(count));
  char* recv = static_cast<char*>(c.Alloc(count * world));
  if (!send || !recv) {
    Fail("alloc: " + c.error());
    return 1;
  }
  std::vector<char> host(count * world, 7);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Checker ck;
  if (ck.Init()) return 1;
  CK(cudaMemsetAsync(recv, 0x33, count * world, s));
  dmagather::kernels::FillPattern(send, count, 777, rank, s);
  dmagather_op_t op = 0;
  void* out = rank == 1 ? static_cast<void*>(host.data()) : recv;
  const auto t0 = Clock::now();
  dmagather_status_t st = dmagather_allgather_async(c.get(), send, out, count, DMAGATHER_UINT8, s, &op);
  if (rank == 1 && st != DMAGATHER_FALLBACK) {
    Fail(std::string("rank 1 (host output) submit returned ") + dmagather_status_string(st) + ": " + c.error());
    return 1;
  }
  if (op == 0) {
    Fail("rank " + std::to_string(rank) + ": no op handle");
    return 1;
  }
  dmagather_op_wait_stream(c.get(), op, s);
  st = dmagather_op_wait(c.get(), op);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (st != DMAGATHER_FALLBACK || c.error().find("rank 1") == std::string::npos) {
    Fail("rank " + std::to_string(rank) + ": op_wait returned " + dmagather_status_string(st) + " (" + c.error() +
         "), expected FALLBACK naming rank 1");
    return 1;
  }
  if (ms > 1000) {
    Fail("fallback verdict took " + std::to_string(ms) + " ms");
    return 1;
  }
  // Nothing was copied: every other rank's shard of the output is still
  // the 0x33 sentinel (the daemon never ran the op).
  std::vector<unsigned char> got(count * world);
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(got.data(), recv, got.size(), cudaMemcpyDeviceToHost));
  for (int r = 0; r < world && rank != 1; ++r) {
    if (r == rank) continue;
    for (size_t i = 0; i < count; ++i) {
      if (got[r * count + i] != 0x33) {
        Fail("rank " + std::to_string(rank) + ": shard " + std::to_string(r) + " was written by a failed op");
        return 1;
      }
    }
  }
  if (rank == 0) printf("  fallback: every rank got FALLBACK in %.1f ms: %s\n", ms, c.error().c_str());
  // The job goes on: the next op is bit-exact.
  return CheckOne(c, ck, s, send, recv, DMAGATHER_UINT8, count, 0, 778, "after fallback");
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

// One flat AllGather between arbitrary device pointers, checked bit-exact.
int GatherChecked(dmagather::Comm& c, Checker& ck, cudaStream_t s, char* in, char* recv, size_t shard, uint64_t seed,
                  const std::string& label) {
  const int world = c.size(), rank = c.rank();
  CK(cudaMemsetAsync(recv, 0xA5, shard * world, s));
  if (in != recv + rank * shard) CK(cudaMemsetAsync(recv + rank * shard, 0x5A, shard, s));
  dmagather::kernels::FillPattern(in, shard, seed, rank, s);
  if (!Ok(c, c.AllGather(in, recv, shard, DMAGATHER_UINT8, s), label)) return 1;
  for (int r = 0; r < world; ++r) ck.Compare(recv + r * shard, shard, seed, r, s);
  unsigned long long first = 0;
  const unsigned long long bad = ck.Read(s, &first);
  if (!Ok(c, c.Wait(), label + " wait")) return 1;
  if (bad != 0) {
    Fail("rank " + std::to_string(rank) + " " + label + ": " + std::to_string(bad) + " wrong words, first at byte " +
         std::to_string(first));
    ck.Reset(s);
    return 1;
  }
  return 0;
}

int ModeVmm(int rank, int world) {
  dmagather::Comm c(nullptr, Job("vmm"), world, rank);
  if (!c.ok()) {
    Fail("init: " + c.error());
    return 1;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Checker ck;
  if (ck.Init()) return 1;
  const size_t chunk = 2 << 20;
  VmmArena in, out;
  // Inputs: 4 chunks; outputs: up to 12 chunks, 8 mapped at first.
  if (in.Create(4, chunk, 4, true) || out.Create(12, chunk, 8, true)) return 1;
  const size_t shard = (3 << 20) + 12345;   // Spans 2-3 chunks wherever it starts.
  const size_t in_off = (1 << 20) + 333;    // Inside chunk 0, runs into chunk 2.
  const size_t out_off = (1 << 20) + 4097;  // Output: world * shard from here.
  if (out_off + world * shard > 8 * chunk) {
    Fail("layout");
    return 1;
  }
  int bad = 0;
  for (int i = 0; i < 20; ++i) {  // Out of place, then in place, alternating.
    char* recv = out.at(out_off);
    char* src = (i % 2 == 0) ? in.at(in_off) : recv + rank * shard;
    bad += GatherChecked(c, ck, s, src, recv, shard, 5000 + i, "vmm step " + std::to_string(i));
  }
  // Host cost of the per-submit validity check of a registration (one
  // pointer attribute per chunk under the range): dmagather_register of
  // already registered VMM memory vs cudaMalloc memory.
  char* plain = static_cast<char*>(c.Alloc(world * shard));
  if (plain == nullptr) {
    Fail("alloc: " + c.error());
    return 1;
  }
  auto time_register = [&](char* p) {
    const auto t0 = Clock::now();
    for (int k = 0; k < 2000; ++k) c.Register(p, world * shard);
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2000;
  };
  const double us_plain = time_register(plain), us_vmm = time_register(out.at(out_off));
  // Remap: the chunk under rank 1's output shard gets new physical memory at
  // the same address (what an allocator does after empty_cache and regrowth).
  cudaStreamSynchronize(s);
  sh->step[rank].store(1);
  for (int r = 0; r < world; ++r)
    while (sh->step[r].load() < 1) usleep(100);
  const size_t remap_chunk = (out_off + 1 * shard) / chunk;
  if (out.Unmap(remap_chunk) || out.Map(remap_chunk)) return 1;
  for (int i = 0; i < 4; ++i) {
    bad += GatherChecked(c, ck, s, in.at(in_off), out.at(out_off), shard, 6000 + i, "after remap " + std::to_string(i));
  }
  // Growth: map chunks 8..11 and gather into a range that reaches them.
  for (size_t k = 8; k < 12; ++k) {
    if (out.Map(k)) return 1;
  }
  const size_t grown_off = 6 * chunk + 777;
  const size_t grown_shard = (12 * chunk - grown_off) / world - 5;
  VmmArena big_in;
  if (big_in.Create(5, chunk, 5, true)) return 1;
  bad += GatherChecked(c, ck, s, big_in.at(3), out.at(grown_off), grown_shard, 7000, "grown range");
  bad += GatherChecked(c, ck, s, big_in.at(3), out.at(grown_off), grown_shard, 7001, "grown range again");
  if (rank == 0) {
    printf(
        "  vmm: 2 MiB chunks, shard %zu B spanning chunks; 20 steps + 4 after a remap + 2 over grown range, %d "
        "failed on rank 0; per-submit registration check: %.2f us (VMM, %zu chunks) vs %.2f us (cudaMalloc)\n",
        shard, bad, us_vmm, (out_off % chunk + world * shard + chunk - 1) / chunk, us_plain);
  }
  return bad != 0;
}

int ModeVmmUnshareable(int rank, int world) {
  dmagather::Comm c(nullptr, Job("vmm_unshareable"), world, rank);
  if (!c.ok()) {
    Fail("init: " + c.error());
    return 1;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Checker ck;
  if (ck.Init()) return 1;
  const size_t chunk = 2 << 20, shard = (1 << 20) + 99;
  VmmArena out;
  if (out.Create(4, chunk, 4, /*share=*/rank != 1)) return 1;
  char* send = static_cast<char*>(c.Alloc(shard));
  if (send == nullptr) {
    Fail("alloc: " + c.error());
    return 1;
  }
  CK(cudaMemsetAsync(out.at(0), 0x33, shard * world, s));
  dmagather::kernels::FillPattern(send, shard, 31, rank, s);
  dmagather_op_t op = 0;
  dmagather_status_t st = dmagather_allgather_async(c.get(), send, out.at(0), shard, DMAGATHER_UINT8, s, &op);
  if (rank == 1 && st != DMAGATHER_FALLBACK) {
    Fail(std::string("rank 1 (unshareable VMM output) submit returned ") + dmagather_status_string(st) + ": " +
         c.error());
    return 1;
  }
  if (op == 0) {
    Fail("rank " + std::to_string(rank) + ": no op handle");
    return 1;
  }
  dmagather_op_wait_stream(c.get(), op, s);
  st = dmagather_op_wait(c.get(), op);
  const std::string why = c.error();
  if (st != DMAGATHER_FALLBACK || why.find("rank 1") == std::string::npos ||
      why.find("shareable handle") == std::string::npos) {
    Fail("rank " + std::to_string(rank) + ": op_wait returned " + dmagather_status_string(st) + " (" + why +
         "), expected FALLBACK naming rank 1 and the missing shareable handle type");
    return 1;
  }
  CK(cudaStreamSynchronize(s));
  if (rank == 0) printf("  vmm_unshareable: every rank got FALLBACK: %s\n", why.c_str());
  char* recv = static_cast<char*>(c.Alloc(shard * world));
  if (recv == nullptr) {
    Fail("alloc: " + c.error());
    return 1;
  }
  return GatherChecked(c, ck, s, send, recv, shard, 32, "after fallback");
}

// --- CUDA graph capture ---

int ModeGraph(int rank, int world) {
  dmagather::Comm c(nullptr, Job("graph"), world, rank);
  if (!c.ok()) {
    Fail("init: " + c.error());
    return 1;
  }
  const size_t shard_a = (2 << 20) + 4104, shard_b = 65536 + 40;  // Bytes (uint8 / float32 counts below).
  char* send = static_cast<char*>(c.Alloc(shard_a));
  char* recv_a = static_cast<char*>(c.Alloc(shard_a * world));
  char* recv_b = static_cast<char*>(c.Alloc(shard_b * world));
  if (!send || !recv_a || !recv_b) {
    Fail("alloc: " + c.error());
    return 1;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
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
  dmagather_status_t st_a = c.AllGather(send, recv_a, shard_a, DMAGATHER_UINT8, s);
  dmagather_status_t st_b = c.AllGather(recv_b + rank * shard_b, recv_b, shard_b / 4, DMAGATHER_FLOAT32, s);
  for (int r = 0; r < world; ++r) {
    dmagather::kernels::ComparePatternDeviceSeed(recv_a + r * shard_a, shard_a, d, r, d + 1, d + 2, s);
    dmagather::kernels::ComparePatternDeviceSeed(recv_b + r * shard_b, shard_b, d, r + 100, d + 1, d + 2, s);
  }
  cudaGraph_t graph = nullptr;
  cudaError_t end = cudaStreamEndCapture(s, &graph);
  if (st_a != DMAGATHER_OK || st_b != DMAGATHER_OK) {
    Fail("rank " + std::to_string(rank) + ": captured allgather returned " + dmagather_status_string(st_a) + "/" +
         dmagather_status_string(st_b) + ": " + c.error());
    return 1;
  }
  CK(end);
  cudaGraphExec_t exec = nullptr;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  // Every rank holds off until all have instantiated (no host sync of the
  // stream below, only this start line).
  sh->step[rank].store(1);
  for (int r = 0; r < world; ++r)
    while (sh->step[r].load() < 1) usleep(100);
  const int replays = 100;
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
    Fail("rank " + std::to_string(rank) + ": after " + std::to_string(replays) +
         " replays step=" + std::to_string(h[0]) + ", " + std::to_string(h[1]) + " wrong words (first at byte " +
         std::to_string(h[2]) + ")");
    return 1;
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
  Checker ck;
  if (ck.Init()) return 1;
  if (GatherChecked(c, ck, s, send, recv_a, shard_a, 8080, "ordinary op after the graph")) return 1;
  // Graph slots come back when their graphs are destroyed: 40 graphs (more
  // than the 32 slots) captured, replayed twice, checked and destroyed in turn.
  const int graphs = 40;
  for (int k = 0; k < graphs; ++k) {
    const uint64_t seed = 9000 + k;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    dmagather::kernels::FillPattern(recv_b + rank * shard_b, shard_b, seed, rank, s);
    dmagather_status_t st = c.AllGather(recv_b + rank * shard_b, recv_b, shard_b, DMAGATHER_UINT8, s);
    for (int r = 0; r < world; ++r) ck.Compare(recv_b + r * shard_b, shard_b, seed, r, s);
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(s, &g);
    if (st != DMAGATHER_OK) {
      Fail("rank " + std::to_string(rank) + ": capture " + std::to_string(k) + ": " + dmagather_status_string(st) +
           ": " + c.error());
      return 1;
    }
    CK(e);
    cudaGraphExec_t x = nullptr;
    CK(cudaGraphInstantiate(&x, g, 0));
    CK(cudaGraphLaunch(x, s));
    CK(cudaGraphLaunch(x, s));
    unsigned long long first = 0;
    const unsigned long long wrong = ck.Read(s, &first);
    if (wrong != 0) {
      Fail("rank " + std::to_string(rank) + ": graph " + std::to_string(k) + ": " + std::to_string(wrong) +
           " wrong words");
      return 1;
    }
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
    CK(cudaDeviceSynchronize());
    usleep(2000);  // The slot's user object is released on a CUDA thread.
  }
  if (rank == 0) printf("  graph: %d more graphs captured, replayed and destroyed in turn (32 slots)\n", graphs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  sh = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (sh) Shared();
  int bad = 0;
  if (mode == "dtypes") {
    bad = Launch(4, ModeDtypes);
  } else if (mode == "suballoc") {
    bad = Launch(3, ModeSuballoc);
  } else if (mode == "stream") {
    bad = Launch(4, ModeStream);
  } else if (mode == "eight") {
    bad = Launch(8, ModeEight);
  } else if (mode == "kill") {
    int dead = Launch(3, ModeKill);
    bad = dead == 1 ? 0 : 1;  // Exactly the killed rank exits abnormally.
    if (dead != 1 && sh->failures.load() == 0) Fail(std::to_string(dead) + " rank(s) ended abnormally, expected 1");
    if (bad == 0) {
      // The daemon serves a new job afterwards.
      int second = Launch(2, [](int r, int w) { return ModeEight(r, w); });
      if (second != 0) {
        bad = 1;
        Fail("second job after the kill failed");
      } else {
        printf("  kill: a second job ran correctly afterwards\n");
      }
    }
  } else if (mode == "mismatch") {
    bad = Launch(2, ModeMismatch);
  } else if (mode == "ophandles") {
    bad = Launch(3, ModeOpHandles);
  } else if (mode == "coalesced") {
    bad = Launch(3, ModeCoalesced);
  } else if (mode == "fallback") {
    bad = Launch(3, ModeFallback);
  } else if (mode == "vmm") {
    bad = Launch(3, ModeVmm);
  } else if (mode == "vmm_unshareable") {
    bad = Launch(3, ModeVmmUnshareable);
  } else if (mode == "graph") {
    bad = Launch(3, ModeGraph);
  } else {
    fprintf(stderr,
            "usage: allgather_gpu_test "
            "dtypes|suballoc|stream|eight|kill|mismatch|ophandles|coalesced|fallback|vmm|vmm_unshareable|graph\n");
    return 2;
  }
  if (bad != 0 || sh->failures.load() != 0) {
    printf("FAIL %s: %s\n", mode.c_str(), sh->why[0] ? sh->why : "a rank failed");
    return 1;
  }
  printf("PASS %s\n", mode.c_str());
  return 0;
}

// Reduce-scatter and all-to-all on the cuda backend, against a running
// dmagatherd --backend=cuda (DMAGATHER_SOCKET): ranks are forked processes
// (tests/gpu/ranks.h: one per GPU where there are several); inputs are made on the host (tests/support/
// reduce_reference.h), results copied back and compared bit-exactly with the
// reference reduction. Prints "PASS <mode>" or "FAIL <mode>: why".
//
//   rs        4 ranks; every dtype x op x counts {1, 4097, 300000} x {out of
//             place, in place}; 2 MiB of staging, so the large ones move in
//             slices (kernel sums on the stream between them)
//   async     3 ranks; 8 async reduce-scatters on one stream, each waited on
//             a second stream (dmagather_op_wait_stream), all-gathers in
//             between; one host sync at the end
//   graph     3 ranks; one CUDA graph (global capture mode) of two
//             reduce-scatters (bf16 sum, fp32 avg in place), an all-to-all
//             and an async fp16 reduce-scatter waited on a forked stream: 20
//             replays (DMAGATHER_TEST_GRAPH_REPLAYS) with new inputs,
//             bit-exact; an ordinary op beside it; a
//             capture past the staging bound is FALLBACK everywhere, and fits
//             once the first graph is destroyed
//   alltoall  3 ranks; all-to-all of int64 (own chunk on the rank's stream)
#include <cuda_runtime.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dmagather/client.h"
#include "tests/gpu/ranks.h"
#include "tests/support/reduce_reference.h"

namespace {

using dmagather::support::ReduceScatterExpected;
using dmagather::support::ReduceScatterInput;

struct Shared {
  std::atomic<int> failures{0};
  char why[512] = {};
};
Shared* sh = nullptr;

int Fail(int rank, const std::string& why) {
  const std::string line = "rank " + std::to_string(rank) + ": " + why;
  if (sh->failures.fetch_add(1) == 0) snprintf(sh->why, sizeof(sh->why), "%s", line.c_str());
  fprintf(stderr, "  check failed: %s\n", line.c_str());
  return 1;
}

#define CK(rank, x)                                                                            \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) return Fail(rank, std::string(#x) + " -> " + cudaGetErrorName(e_)); \
  } while (0)

// Uploads rank `rank`'s send for (dtype, count, seed) into d_send.
int Upload(int rank, int world, uint32_t dtype, uint64_t count, uint64_t seed, char* d_send, cudaStream_t s) {
  const std::vector<unsigned char> mine = ReduceScatterInput(rank, world, dtype, count, seed);
  CK(rank, cudaMemcpyAsync(d_send, mine.data(), mine.size(), cudaMemcpyHostToDevice, s));
  CK(rank, cudaStreamSynchronize(s));
  return 0;
}

// d_out (count elements, already complete on `s`) against the reference.
int Check(int rank, int world, uint32_t dtype, int redop, uint64_t count, uint64_t seed, const char* d_out,
          cudaStream_t s, const std::string& what) {
  const size_t size = dmagather::common::DtypeSize(dtype);
  std::vector<unsigned char> got(count * size + 1);
  CK(rank, cudaMemcpyAsync(got.data(), d_out, count * size, cudaMemcpyDeviceToHost, s));
  CK(rank, cudaStreamSynchronize(s));
  const std::vector<unsigned char> want = ReduceScatterExpected(rank, world, dtype, redop, count, seed);
  for (uint64_t i = 0; i < count; ++i) {
    if (std::memcmp(got.data() + i * size, want.data() + i * size, size) != 0) {
      return Fail(rank, what + ": element " + std::to_string(i) + " differs from the reference");
    }
  }
  return 0;
}

int ModeRs(dmagather::Comm& c, int rank, int world, cudaStream_t s) {
  const uint64_t counts[] = {1, 4097, 300000};
  char* send = static_cast<char*>(c.Alloc(uint64_t(world) * 300000 * 8));
  char* recv = static_cast<char*>(c.Alloc(300000 * 8));
  if (send == nullptr || recv == nullptr) return Fail(rank, "alloc: " + c.error());
  uint64_t seed = 0;
  for (uint32_t dtype = 0; dtype < dmagather::common::kNumDtypes; ++dtype) {
    for (int redop = 0; redop < (dtype >= dmagather::common::kDtypeFloat16 ? 2 : 1); ++redop) {
      for (uint64_t count : counts) {
        for (bool in_place : {false, true}) {
          ++seed;
          if (Upload(rank, world, dtype, count, seed, send, s) != 0) return 1;
          char* out = in_place ? send + uint64_t(rank) * count * dmagather::common::DtypeSize(dtype) : recv;
          const std::string what = std::string(dmagather::common::DtypeName(dtype)) + (redop ? " avg" : " sum") +
                                   " count=" + std::to_string(count) + (in_place ? " in place" : "");
          if (c.ReduceScatter(send, out, count, static_cast<dmagather_dtype_t>(dtype),
                              static_cast<dmagather_redop_t>(redop), s) != DMAGATHER_OK) {
            return Fail(rank, what + ": " + c.error());
          }
          if (Check(rank, world, dtype, redop, count, seed, out, s, what) != 0) return 1;
        }
      }
    }
  }
  return 0;
}

int ModeAsync(dmagather::Comm& c, int rank, int world, cudaStream_t s) {
  constexpr int kOps = 8;
  constexpr uint64_t kCount = 65536;
  cudaStream_t s2 = nullptr;
  CK(rank, cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  std::vector<char*> sends, outs;
  char* ag = static_cast<char*>(c.Alloc(uint64_t(world) * 4096));
  for (int k = 0; k < kOps; ++k) {
    sends.push_back(static_cast<char*>(c.Alloc(uint64_t(world) * kCount * 2)));
    outs.push_back(static_cast<char*>(c.Alloc(kCount * 2)));
    if (sends.back() == nullptr || outs.back() == nullptr || ag == nullptr) return Fail(rank, "alloc: " + c.error());
    if (Upload(rank, world, dmagather::common::kDtypeBfloat16, kCount, 500 + k, sends.back(), s) != 0) return 1;
  }
  for (int k = 0; k < kOps; ++k) {
    dmagather_op_t rs = 0, g = 0;
    if (dmagather_reduce_scatter_async(c.get(), sends[k], outs[k], kCount, DMAGATHER_BFLOAT16,
                                       k % 2 ? DMAGATHER_AVG : DMAGATHER_SUM, s, &rs) != DMAGATHER_OK ||
        dmagather_allgather_async(c.get(), ag + uint64_t(rank) * 4096, ag, 4096, DMAGATHER_UINT8, s, &g) !=
            DMAGATHER_OK ||
        dmagather_op_wait_stream(c.get(), rs, s2) != DMAGATHER_OK) {
      return Fail(rank, "async op " + std::to_string(k) + ": " + c.error());
    }
  }
  CK(rank, cudaStreamSynchronize(s));
  if (c.Wait() != DMAGATHER_OK) return Fail(rank, "wait: " + c.error());
  for (int k = 0; k < kOps; ++k) {
    if (Check(rank, world, dmagather::common::kDtypeBfloat16, k % 2, kCount, 500 + k, outs[k], s2,
              "async op " + std::to_string(k)) != 0) {
      return 1;
    }
  }
  return 0;
}

// Rank `rank`'s all-to-all output (world chunks of `count` int64) against the
// inputs of seed `seed`.
int CheckAllToAll(int rank, int world, uint64_t count, uint64_t seed, const char* d_recv, cudaStream_t s,
                  const std::string& what) {
  std::vector<unsigned char> got(uint64_t(world) * count * 8);
  CK(rank, cudaMemcpyAsync(got.data(), d_recv, got.size(), cudaMemcpyDeviceToHost, s));
  CK(rank, cudaStreamSynchronize(s));
  for (int src = 0; src < world; ++src) {
    const std::vector<unsigned char> theirs =
        ReduceScatterInput(src, world, dmagather::common::kDtypeInt64, count, seed);
    if (std::memcmp(got.data() + src * count * 8, theirs.data() + rank * count * 8, count * 8) != 0) {
      return Fail(rank, what + ": the chunk from rank " + std::to_string(src) + " differs");
    }
  }
  return 0;
}

// Captures one fp32 SUM reduce-scatter of `count` into a graph on `s`: its
// status (the graph, instantiated, in *exec when OK).
dmagather_status_t CaptureBig(dmagather::Comm& c, int rank, char* send, char* recv, uint64_t count, cudaStream_t s,
                              cudaGraphExec_t* exec, std::string* why) {
  *exec = nullptr;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) != cudaSuccess) return DMAGATHER_INTERNAL;
  const dmagather_status_t st = c.ReduceScatter(send, recv, count, DMAGATHER_FLOAT32, DMAGATHER_SUM, s);
  *why = c.error();
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(s, &graph) != cudaSuccess) {
    *why = "the capture was invalidated (" + *why + ")";
    return DMAGATHER_INTERNAL;
  }
  if (st == DMAGATHER_OK && cudaGraphInstantiate(exec, graph, 0) != cudaSuccess) *exec = nullptr;
  cudaGraphDestroy(graph);  // The instance holds what it needs.
  (void)rank;
  return st;
}

int ModeGraph(dmagather::Comm& c, int rank, int world, cudaStream_t s) {
  constexpr uint64_t kA = 4097, kB = 1000, kC = 513, kD = 65536, kBig = 150000;
  const char* replays_env = getenv("DMAGATHER_TEST_GRAPH_REPLAYS");  // tests/gpu/run.sh restart
  const int kReplays = replays_env != nullptr ? atoi(replays_env) : 20;
  using dmagather::common::kDtypeBfloat16;
  using dmagather::common::kDtypeFloat16;
  using dmagather::common::kDtypeFloat32;
  using dmagather::common::kDtypeInt64;
  const uint64_t w = uint64_t(world);
  char* a_send = static_cast<char*>(c.Alloc(w * kA * 2));
  char* a_recv = static_cast<char*>(c.Alloc(kA * 2));
  char* b_send = static_cast<char*>(c.Alloc(w * kB * 4));
  char* c_send = static_cast<char*>(c.Alloc(w * kC * 8));
  char* c_recv = static_cast<char*>(c.Alloc(w * kC * 8));
  char* d_send = static_cast<char*>(c.Alloc(w * kD * 2));
  char* d_recv = static_cast<char*>(c.Alloc(kD * 2));
  char* big_send = static_cast<char*>(c.Alloc(w * kBig * 4));
  char* big_recv = static_cast<char*>(c.Alloc(kBig * 4));
  if (!a_send || !a_recv || !b_send || !c_send || !c_recv || !d_send || !d_recv || !big_send || !big_recv) {
    return Fail(rank, "alloc: " + c.error());
  }
  char* b_out = b_send + uint64_t(rank) * kB * 4;  // In place.
  cudaStream_t s2 = nullptr;
  cudaEvent_t fork_ev = nullptr, join_ev = nullptr;
  CK(rank, cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CK(rank, cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming));
  CK(rank, cudaEventCreateWithFlags(&join_ev, cudaEventDisableTiming));

  // One graph: bf16 sum out of place, fp32 avg in place, an int64
  // all-to-all, and an async fp16 reduce-scatter waited on a forked stream.
  // Global mode, as torch.cuda.graph captures.
  CK(rank, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  dmagather_op_t a2a = 0, d_op = 0;
  dmagather_status_t st = c.ReduceScatter(a_send, a_recv, kA, DMAGATHER_BFLOAT16, DMAGATHER_SUM, s);
  if (st == DMAGATHER_OK) st = c.ReduceScatter(b_send, b_out, kB, DMAGATHER_FLOAT32, DMAGATHER_AVG, s);
  if (st == DMAGATHER_OK) st = dmagather_alltoall_async(c.get(), c_send, c_recv, kC, DMAGATHER_INT64, s, &a2a);
  if (st == DMAGATHER_OK) st = dmagather_op_wait_stream(c.get(), a2a, s);
  if (st == DMAGATHER_OK) {
    st = dmagather_reduce_scatter_async(c.get(), d_send, d_recv, kD, DMAGATHER_FLOAT16, DMAGATHER_SUM, s, &d_op);
  }
  if (st == DMAGATHER_OK &&
      (cudaEventRecord(fork_ev, s) != cudaSuccess || cudaStreamWaitEvent(s2, fork_ev, 0) != cudaSuccess)) {
    st = DMAGATHER_INTERNAL;
  }
  if (st == DMAGATHER_OK) st = dmagather_op_wait_stream(c.get(), d_op, s2);
  if (st == DMAGATHER_OK &&
      (cudaEventRecord(join_ev, s2) != cudaSuccess || cudaStreamWaitEvent(s, join_ev, 0) != cudaSuccess)) {
    st = DMAGATHER_INTERNAL;
  }
  const std::string why = c.error();
  cudaGraph_t graph = nullptr;
  CK(rank, cudaStreamEndCapture(s, &graph));
  if (st != DMAGATHER_OK) return Fail(rank, std::string("capture: ") + dmagather_status_string(st) + ": " + why);
  cudaGraphExec_t exec = nullptr;
  CK(rank, cudaGraphInstantiate(&exec, graph, 0));

  // Replays with new inputs each time (uploaded before the launch, on the
  // same stream); every output bit-exact.
  for (int k = 0; k < kReplays; ++k) {
    const uint64_t seed = 1000 + 10 * k;
    if (Upload(rank, world, kDtypeBfloat16, kA, seed, a_send, s) != 0 ||
        Upload(rank, world, kDtypeFloat32, kB, seed + 1, b_send, s) != 0 ||
        Upload(rank, world, kDtypeInt64, kC, seed + 2, c_send, s) != 0 ||
        Upload(rank, world, kDtypeFloat16, kD, seed + 3, d_send, s) != 0) {
      return 1;
    }
    CK(rank, cudaGraphLaunch(exec, s));
    const std::string r = "replay " + std::to_string(k) + ": ";
    if (Check(rank, world, kDtypeBfloat16, 0, kA, seed, a_recv, s, r + "bf16 sum") != 0 ||
        Check(rank, world, kDtypeFloat32, 1, kB, seed + 1, b_out, s, r + "fp32 avg in place") != 0 ||
        CheckAllToAll(rank, world, kC, seed + 2, c_recv, s, r + "all-to-all") != 0 ||
        Check(rank, world, kDtypeFloat16, 0, kD, seed + 3, d_recv, s, r + "fp16 async") != 0) {
      return 1;
    }
  }
  // An ordinary reduce-scatter beside the live graph.
  if (Upload(rank, world, kDtypeBfloat16, kA, 77, a_send, s) != 0) return 1;
  if (c.ReduceScatter(a_send, a_recv, kA, DMAGATHER_BFLOAT16, DMAGATHER_SUM, s) != DMAGATHER_OK) {
    return Fail(rank, "ordinary op beside the graph: " + c.error());
  }
  if (Check(rank, world, kDtypeBfloat16, 0, kA, 77, a_recv, s, "ordinary op beside the graph") != 0) return 1;

  // The captures' staging is bounded (2 MiB here): one more that does not
  // fit is FALLBACK on every rank, and the capture stays valid.
  cudaGraphExec_t big = nullptr;
  std::string big_why;
  st = CaptureBig(c, rank, big_send, big_recv, kBig, s, &big, &big_why);
  if (st != DMAGATHER_FALLBACK || big_why.find("live captures hold") == std::string::npos) {
    return Fail(rank,
                "a capture past the staging bound gave " + std::string(dmagather_status_string(st)) + ": " + big_why);
  }
  // Destroying the first graph frees its staging (once CUDA has released
  // its user objects, asynchronously): the same capture then fits. Every
  // attempt has one verdict on every rank, so the ranks retry in step.
  CK(rank, cudaStreamSynchronize(s2));
  CK(rank, cudaGraphExecDestroy(exec));
  CK(rank, cudaGraphDestroy(graph));
  for (int attempt = 0; st != DMAGATHER_OK; ++attempt) {
    if (attempt == 200) return Fail(rank, "the destroyed graph's staging never came back: " + big_why);
    if (attempt != 0) usleep(10000);
    st = CaptureBig(c, rank, big_send, big_recv, kBig, s, &big, &big_why);
    if (st != DMAGATHER_OK && st != DMAGATHER_FALLBACK) return Fail(rank, "capture after destroy: " + big_why);
  }
  if (big == nullptr) return Fail(rank, "cudaGraphInstantiate of the large capture failed");
  if (Upload(rank, world, kDtypeFloat32, kBig, 4242, big_send, s) != 0) return 1;
  CK(rank, cudaGraphLaunch(big, s));
  if (Check(rank, world, kDtypeFloat32, 0, kBig, 4242, big_recv, s, "large capture after destroy") != 0) return 1;
  CK(rank, cudaGraphExecDestroy(big));
  CK(rank, cudaStreamSynchronize(s));
  return 0;
}

int ModeAllToAll(dmagather::Comm& c, int rank, int world, cudaStream_t s) {
  const uint64_t count = 100003;
  char* send = static_cast<char*>(c.Alloc(uint64_t(world) * count * 8));
  char* recv = static_cast<char*>(c.Alloc(uint64_t(world) * count * 8));
  if (send == nullptr || recv == nullptr) return Fail(rank, "alloc: " + c.error());
  if (Upload(rank, world, dmagather::common::kDtypeInt64, count, 91, send, s) != 0) return 1;
  if (c.AllToAll(send, recv, count, DMAGATHER_INT64, s) != DMAGATHER_OK) return Fail(rank, "alltoall: " + c.error());
  return CheckAllToAll(rank, world, count, 91, recv, s, "all-to-all");
}

struct Mode {
  const char* name;
  int world;
  int (*run)(dmagather::Comm&, int, int, cudaStream_t);
};

const Mode kModes[] = {
    {"rs", 4, ModeRs}, {"async", 3, ModeAsync}, {"graph", 3, ModeGraph}, {"alltoall", 3, ModeAllToAll}};

}  // namespace

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "";
  const Mode* m = nullptr;
  for (const Mode& k : kModes) {
    if (name == k.name) m = &k;
  }
  if (m == nullptr) {
    fprintf(stderr, "usage: reduce_scatter_gpu_test rs|async|graph|alltoall\n");
    return 2;
  }
  setenv("DMAGATHER_STAGING_MB", "2", 1);  // Past the bound at 300000 elements: slices.
  sh = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (sh) Shared();
  const std::string job = std::string("gpurs-") + m->name + "-" + std::to_string(getpid());
  const int bad = dmagather::testing::LaunchRanks(m->world, [&](int rank, int world) {
    dmagather::Comm c(nullptr, job, world, rank);
    if (!c.ok()) return Fail(rank, "init: " + c.error());
    cudaStream_t s = nullptr;
    CK(rank, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return m->run(c, rank, world, s);
  });
  if (bad != 0 || sh->failures.load() != 0) {
    printf("FAIL %s: %s\n", m->name, sh->why[0] ? sh->why : "a rank failed");
    return 1;
  }
  printf("PASS %s\n", m->name);
  return 0;
}

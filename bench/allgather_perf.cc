// dmagather-perf: the main job. Starts N rank processes (or runs one rank
// under an external launcher), checks AllGather bit-exact for every dtype
// against a locally computed reference, then times it and prints the
// results table (and writes it as CSV).
//
//   allgather_perf --socket=/tmp/x/dmagatherd.sock --ranks=4
#if DMAGATHER_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif
#include <dlfcn.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "dmagather/client.h"
#include "dmagather/v1/telemetry.grpc.pb.h"
#include "tests/support/verify.h"
#if DMAGATHER_WITH_CUDA
#include "kernels/verify.h"
#endif

ABSL_FLAG(std::string, socket, "",
          "dmagatherd socket (default: $DMAGATHER_SOCKET, then /run/dmagather/dmagatherd.sock).");
ABSL_FLAG(int, ranks, 4, "Rank processes to start (ignored with --rank).");
ABSL_FLAG(int, rank, -1, "Run only this rank (external launcher); needs --world and --job.");
ABSL_FLAG(int, world, 0, "World size with --rank.");
ABSL_FLAG(std::string, job, "", "Job key (default: perf-<pid>).");
ABSL_FLAG(std::string, check_counts, "1,3,4095,1048583", "Element counts per rank for the correctness checks.");
ABSL_FLAG(std::string, sizes_mib, "1,16,64", "Shard sizes per rank (MiB) for the bandwidth table.");
ABSL_FLAG(std::string, bw_dtypes, "float32,bfloat16", "Dtypes timed in the bandwidth table.");
ABSL_FLAG(int, iters, 20, "Timed iterations per bandwidth row.");
ABSL_FLAG(int, warmup, 3, "Untimed iterations before each bandwidth row.");
ABSL_FLAG(std::string, csv, "results/allgather_results.csv",
          "Where to write the bandwidth table as CSV (its folder is made; '' to skip).");
// cuda backend only:
ABSL_FLAG(std::string, latency_kib, "4,64,1024,16384,65536",
          "cuda: shard sizes (KiB) of the end-to-end latency table (vs an in-process cudaMemcpyAsync).");
ABSL_FLAG(int, latency_iters, 100, "cuda: iterations per latency row.");
ABSL_FLAG(std::string, latency_trace, "",
          "cuda: rank 0 appends every timed latency iteration here as CSV (shard_KiB,iter,us), to see a tail's shape.");
ABSL_FLAG(double, overlap_s, 3.0, "cuda: seconds per phase of the GEMM + AllGather overlap test (0: skip).");
ABSL_FLAG(int, overlap_mib, 64, "cuda: shard size (MiB, bfloat16) of the AllGathers in the overlap test.");
ABSL_FLAG(int, gemm_n, 8192, "cuda: the overlap test's GEMM is bf16 n x n x n through cuBLAS.");

namespace {

using dmagather::support::CheckAllGather;
using dmagather::support::FillPattern;
using dmagather::support::Variant;

constexpr int kMaxRanks = 64;
constexpr int kMaxRows = 64;
constexpr int kMaxIters = 1000;
constexpr int kMaxLatencyRows = 16;

struct Shared {  // MAP_SHARED between the launcher and its rank processes.
  char backend[32];
  char version[32];
  int check_failed[DMAGATHER_NUM_DTYPES];
  int check_ran[DMAGATHER_NUM_DTYPES];
  char first_failure[512];
  double iter_ms[kMaxRows][kMaxIters][kMaxRanks];
  std::atomic<int> rank_errors;
  // cuda extras (written by rank 0, printed by the launcher).
  std::atomic<int> barrier_count;
  std::atomic<int> barrier_gen;
  std::atomic<int> stop;  // Overlap test: 0 = go on, n = the last op is number n.
  std::atomic<int> gemm_ok;
  int latency_rows;
  double lat_shard_kib[kMaxLatencyRows], lat_p50_us[kMaxLatencyRows], lat_p99_us[kMaxLatencyRows];
  double memcpy_p50_us[kMaxLatencyRows];
  char telemetry[1024];
  char overlap[2048];
};

struct Row {
  dmagather_dtype_t dtype;
  size_t count;
};

dmagather_dtype_t ParseDtype(const std::string& s) {
  for (int d = 0; d < DMAGATHER_NUM_DTYPES; ++d) {
    if (s == dmagather_dtype_name(static_cast<dmagather_dtype_t>(d))) return static_cast<dmagather_dtype_t>(d);
  }
  std::cerr << "unknown dtype '" << s << "'\n";
  std::exit(2);
}

std::vector<size_t> ParseList(const std::string& s) {
  std::vector<size_t> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    size_t v = 0;
    if (!absl::SimpleAtoi(p, &v)) {
      std::cerr << "bad number '" << p << "'\n";
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

std::vector<Row> BandwidthRows() {
  std::vector<Row> rows;
  for (absl::string_view dt : absl::StrSplit(absl::GetFlag(FLAGS_bw_dtypes), ',', absl::SkipEmpty())) {
    dmagather_dtype_t d = ParseDtype(std::string(dt));
    for (size_t mib : ParseList(absl::GetFlag(FLAGS_sizes_mib))) {
      rows.push_back(Row{d, (mib << 20) / dmagather_dtype_size(d)});
    }
  }
  if (rows.size() > kMaxRows) rows.resize(kMaxRows);
  return rows;
}

void Fail(Shared* sh, int dtype, const std::string& what) {
  if (sh->check_failed[dtype]++ == 0 && sh->first_failure[0] == '\0') {
    snprintf(sh->first_failure, sizeof(sh->first_failure), "%s", what.c_str());
  }
}

// ---------------------------------------------------------------------------
// cuda backend: buffers are device memory; checks run on the GPU with the
// verification kernels (kernels/verify.h); every AllGather is submitted on
// a CUDA stream. Adds: end-to-end latency per size vs an in-process
// cudaMemcpyAsync, the daemon's hop latency (telemetry), and a cuBLAS GEMM
// running in rank 0 while AllGathers run.

// Bytes of the largest shard the checks (8-byte dtypes) and the bandwidth rows use.
size_t LargestShard(const std::vector<size_t>& counts, const std::vector<Row>& rows) {
  size_t max_shard = 0;
  for (size_t c : counts) max_shard = std::max(max_shard, c * 8);
  for (const Row& r : rows) max_shard = std::max(max_shard, r.count * dmagather_dtype_size(r.dtype));
  return max_shard;
}

// A send buffer of one shard and an output of world shards (+8 KiB each for
// the odd-offset checks). False (after saying why) when allocation fails.
bool AllocBuffers(dmagather::Comm& comm, size_t max_shard, char** send, char** recv) {
  const size_t slack = 8192;
  *send = static_cast<char*>(comm.Alloc(max_shard + slack));
  *recv = static_cast<char*>(comm.Alloc(max_shard * comm.size() + slack));
  if (*send != nullptr && *recv != nullptr) return true;
  std::cerr << "rank " << comm.rank() << ": alloc: " << comm.error() << "\n";
  return false;
}

// Times bandwidth row `row`: --warmup untimed ops, then `iters` timed ones,
// each submitted and completed by run_op. False (after saying why) on error.
bool TimeRow(dmagather::Comm& comm, Shared* sh, size_t row, int iters,
             const std::function<dmagather_status_t()>& run_op) {
  const int rank = comm.rank();
  for (int it = -absl::GetFlag(FLAGS_warmup); it < iters; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    dmagather_status_t st = run_op();
    auto t1 = std::chrono::steady_clock::now();
    if (st != DMAGATHER_OK) {
      std::cerr << "rank " << rank << ": " << dmagather_status_string(st) << ": " << comm.error() << "\n";
      sh->rank_errors++;
      return false;
    }
    if (it >= 0) sh->iter_ms[row][it][rank] = std::chrono::duration<double, std::milli>(t1 - t0).count();
  }
  return true;
}

#if DMAGATHER_WITH_CUDA  // The cuda mode, where the build has the CUDA toolkit.

void Barrier(Shared* sh, int world) {
  const int gen = sh->barrier_gen.load();
  if (sh->barrier_count.fetch_add(1) + 1 == world) {
    sh->barrier_count.store(0);
    sh->barrier_gen.fetch_add(1);
  } else {
    while (sh->barrier_gen.load() == gen) usleep(50);
  }
}

#define CUDA_OR_RETURN(x)                                                           \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::cerr << "rank " << rank << ": " #x ": " << cudaGetErrorName(e_) << "\n"; \
      sh->rank_errors++;                                                            \
      return 5;                                                                     \
    }                                                                               \
  } while (0)

struct GpuCheck {
  unsigned long long* d = nullptr;
  void Reset(cudaStream_t s) {
    unsigned long long h[2] = {0, ~0ull};
    cudaMemcpyAsync(d, h, 16, cudaMemcpyHostToDevice, s);
  }
  unsigned long long Read(cudaStream_t s, unsigned long long* first) {
    unsigned long long h[2] = {~0ull, ~0ull};
    cudaStreamSynchronize(s);
    cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost);
    *first = h[1];
    return h[0];
  }
};

bool CheckOneCuda(dmagather::Comm& comm, GpuCheck& ck, cudaStream_t s, char* sendbuf, char* recvbuf,
                  dmagather_dtype_t dt, size_t count, int variant, uint64_t seed, std::string* why) {
  const int world = comm.size(), rank = comm.rank();
  const size_t es = dmagather_dtype_size(dt), shard = count * es;
  const size_t offset = variant == 3 ? 4096 + 3 * es : 0;  // Misaligned inside the allocation.
  char* recv = recvbuf + offset;
  char* send = variant == 1 ? recv + rank * shard : sendbuf + offset;
  cudaMemsetAsync(recvbuf, 0xA5, shard * world + offset + 64, s);  // Poison.
  dmagather::kernels::FillPattern(send, shard, seed, rank, s);
  ck.Reset(s);
  dmagather_status_t st;
  if (variant == 2) {
    std::vector<void*> outs(world);
    for (int r = 0; r < world; ++r) outs[r] = recv + r * shard;
    st = comm.AllGatherList(send, outs, count, dt, s);
  } else {
    st = comm.AllGather(send, recv, count, dt, s);
  }
  if (st == DMAGATHER_OK) {
    for (int r = 0; r < world; ++r)
      dmagather::kernels::ComparePattern(recv + r * shard, shard, seed, r, ck.d, ck.d + 1, s);
    st = comm.Wait();
  }
  if (st != DMAGATHER_OK) {
    *why = absl::StrFormat("%s: %s", dmagather_status_string(st), comm.error());
    return false;
  }
  unsigned long long first = 0;
  const unsigned long long bad = ck.Read(s, &first);
  if (bad != 0) {
    *why =
        absl::StrFormat("rank %d %s count=%u variant=%d: %u wrong words, first wrong byte at %u (shard of rank %u)",
                        rank, dmagather_dtype_name(dt), count, variant, bad, first, first / std::max<size_t>(shard, 1));
    return false;
  }
  return true;
}

// Telemetry of this job, through the daemon's gRPC socket.
void FetchTelemetry(const std::string& job, Shared* sh) {
  std::string sock = absl::GetFlag(FLAGS_socket);
  if (sock.empty() && std::getenv("DMAGATHER_SOCKET") != nullptr) sock = std::getenv("DMAGATHER_SOCKET");
  if (sock.empty()) sock = DMAGATHER_DEFAULT_SOCKET;
  auto stub =
      dmagather::v1::Telemetry::NewStub(grpc::CreateChannel("unix:" + sock, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  dmagather::v1::StatsRequest req;
  req.set_job_key(job);
  dmagather::v1::StatsReply reply;
  grpc::Status st = stub->Stats(&ctx, req, &reply);
  if (!st.ok() || reply.jobs_size() == 0) {
    snprintf(sh->telemetry, sizeof(sh->telemetry), "telemetry unavailable: %s", st.error_message().c_str());
    return;
  }
  const auto& j = reply.jobs(0);
  std::string fallbacks;
  for (const auto& f : reply.fallbacks()) fallbacks += absl::StrFormat(" %s=%u", f.reason(), f.count());
  snprintf(
      sh->telemetry, sizeof(sh->telemetry),
      "daemon hop latency (last descriptor seen -> copies enqueued), %u ops: p50 %.1f us, p99 %.1f us, max %.1f us\n"
      "daemon op latency (first descriptor seen -> done flags written): p50 %.1f us, p99 %.1f us\n"
      "node same_device_copies: %u; fallbacks:%s",
      (unsigned)j.hop_latency().count(), j.hop_latency().p50_us(), j.hop_latency().p99_us(), j.hop_latency().max_us(),
      j.latency().p50_us(), j.latency().p99_us(), (unsigned)reply.same_device_copies(),
      fallbacks.empty() ? " none" : fallbacks.c_str());
}

// cuBLAS through dlopen, so the benchmark links no cuBLAS and runs the
// host backend where there is none.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmEx gemm = nullptr;
  bool Load(std::string* why) {
    void* h = nullptr;
    for (const char* name : {"libcublas.so.13", "libcublas.so", "/usr/local/cuda/lib64/libcublas.so.13"}) {
      if ((h = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) != nullptr) break;
    }
    if (h == nullptr) {
      *why = std::string("cannot load cuBLAS: ") + dlerror();
      return false;
    }
    create = reinterpret_cast<decltype(create)>(dlsym(h, "cublasCreate_v2"));
    set_stream = reinterpret_cast<decltype(set_stream)>(dlsym(h, "cublasSetStream_v2"));
    gemm = reinterpret_cast<decltype(gemm)>(dlsym(h, "cublasGemmEx"));
    if (!create || !set_stream || !gemm) {
      *why = "cuBLAS lacks cublasCreate_v2/cublasSetStream_v2/cublasGemmEx";
      return false;
    }
    return true;
  }
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * v.size()))];
}

int RunRankCuda(dmagather::Comm& comm, const std::string& job, Shared* sh) {
  const int world = comm.size(), rank = comm.rank();
  const std::vector<size_t> counts = ParseList(absl::GetFlag(FLAGS_check_counts));
  const std::vector<Row> rows = BandwidthRows();
  const std::vector<size_t> lat_kib = ParseList(absl::GetFlag(FLAGS_latency_kib));
  const size_t overlap_shard = size_t(absl::GetFlag(FLAGS_overlap_mib)) << 20;
  size_t max_shard = std::max(overlap_shard, LargestShard(counts, rows));
  for (size_t k : lat_kib) max_shard = std::max(max_shard, k << 10);
  char *sendbuf = nullptr, *recvbuf = nullptr;
  if (!AllocBuffers(comm, max_shard, &sendbuf, &recvbuf)) return 3;
  cudaStream_t s;
  CUDA_OR_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  GpuCheck ck;
  CUDA_OR_RETURN(cudaMalloc(&ck.d, 16));

  // --- Correctness (on the GPU) ---
  uint64_t seed = 0x5eed;
  for (int d = 0; d < DMAGATHER_NUM_DTYPES; ++d) {
    for (size_t count : counts) {
      for (int variant = 0; variant < 4; ++variant) {
        std::string why;
        ++seed;
        if (rank == 0) sh->check_ran[d]++;
        if (!CheckOneCuda(comm, ck, s, sendbuf, recvbuf, static_cast<dmagather_dtype_t>(d), count, variant, seed,
                          &why)) {
          Fail(sh, d, why);
        }
      }
    }
  }

  // --- Bandwidth: one op at a time, each waited for (stream synchronize) ---
  const int iters = std::min(absl::GetFlag(FLAGS_iters), kMaxIters);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    const size_t shard = row.count * dmagather_dtype_size(row.dtype);
    dmagather::kernels::FillPattern(recvbuf + rank * shard, shard, seed + i, rank, s);
    CUDA_OR_RETURN(cudaStreamSynchronize(s));
    char* send = recvbuf + rank * shard;  // In place, as ZeRO-3/FSDP2 lay it out.
    Barrier(sh, world);
    const bool ok = TimeRow(comm, sh, i, iters, [&] {
      dmagather_status_t st = comm.AllGather(send, recvbuf, row.count, row.dtype, s);
      if (st == DMAGATHER_OK && cudaStreamSynchronize(s) != cudaSuccess) st = DMAGATHER_INTERNAL;
      return st;
    });
    if (!ok) return 4;
  }

  // --- End-to-end latency per size vs an in-process cudaMemcpyAsync ---
  const int lat_iters = std::max(10, absl::GetFlag(FLAGS_latency_iters));
  cudaEvent_t e0, e1;
  CUDA_OR_RETURN(cudaEventCreate(&e0));
  CUDA_OR_RETURN(cudaEventCreate(&e1));
  int nrows = 0;
  for (size_t kib : lat_kib) {
    if (nrows == kMaxLatencyRows) break;
    const size_t shard = kib << 10;
    std::vector<double> us;
    Barrier(sh, world);
    for (int it = -5; it < lat_iters; ++it) {
      auto t0 = std::chrono::steady_clock::now();
      if (comm.AllGather(recvbuf + rank * shard, recvbuf, shard, DMAGATHER_UINT8, s) != DMAGATHER_OK ||
          cudaStreamSynchronize(s) != cudaSuccess) {
        std::cerr << "rank " << rank << ": latency: " << comm.error() << "\n";
        sh->rank_errors++;
        return 4;
      }
      auto t1 = std::chrono::steady_clock::now();
      if (it >= 0) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    Barrier(sh, world);
    if (rank == 0 && !absl::GetFlag(FLAGS_latency_trace).empty()) {
      std::ofstream trace(absl::GetFlag(FLAGS_latency_trace), std::ios::app);
      for (size_t i = 0; i < us.size(); ++i) trace << kib << "," << i << "," << us[i] << "\n";
    }
    if (rank == 0) {
      // The same bytes the daemon moves for the whole op (world x (world-1)
      // shards), as one cudaMemcpyAsync in this process, host-timed the same way.
      const size_t total = shard * world * (world - 1);
      char* a = nullptr;
      char* b = nullptr;
      std::vector<double> mus;
      if (cudaMalloc(&a, total) == cudaSuccess && cudaMalloc(&b, total) == cudaSuccess) {
        for (int it = -5; it < lat_iters; ++it) {
          auto t0 = std::chrono::steady_clock::now();
          cudaMemcpyAsync(b, a, total, cudaMemcpyDeviceToDevice, s);
          cudaStreamSynchronize(s);
          auto t1 = std::chrono::steady_clock::now();
          if (it >= 0) mus.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        }
      }
      cudaFree(a);
      cudaFree(b);
      sh->lat_shard_kib[nrows] = double(kib);
      sh->lat_p50_us[nrows] = Percentile(us, 0.5);
      sh->lat_p99_us[nrows] = Percentile(us, 0.99);
      sh->memcpy_p50_us[nrows] = Percentile(mus, 0.5);
    }
    ++nrows;
    Barrier(sh, world);
  }
  if (rank == 0) sh->latency_rows = nrows;

  // --- GEMM in rank 0 while AllGathers run ---
  const double phase_s = absl::GetFlag(FLAGS_overlap_s);
  if (phase_s > 0) {
    const size_t count = overlap_shard / 2;                 // bfloat16
    const double ag_bytes = double(overlap_shard) * world;  // algo bytes per op (output size)
    // Every rank must run the same number of ops (each op needs all of
    // them): rank 0 decides when time is up and names the last op.
    auto ag_loop = [&](double seconds, double* gbps, int* ops) -> bool {
      int n = 0;
      auto t0 = std::chrono::steady_clock::now();
      double el = 0;
      for (;;) {
        if (comm.AllGather(recvbuf + rank * overlap_shard, recvbuf, count, DMAGATHER_BFLOAT16, s) != DMAGATHER_OK)
          return false;
        if (cudaStreamSynchronize(s) != cudaSuccess) return false;
        ++n;
        el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (rank == 0 && sh->stop.load() == 0 && el >= seconds) sh->stop.store(n + 1);
        const int last = sh->stop.load();
        if (last != 0 && n >= last) break;
      }
      *gbps = ag_bytes * n / el / 1e9;
      *ops = n;
      return true;
    };
    Cublas cb;
    std::string why;
    bool have_gemm = rank != 0 || cb.Load(&why);
    if (rank == 0) sh->gemm_ok.store(have_gemm ? 1 : 0);
    Barrier(sh, world);
    const bool have_all = sh->gemm_ok.load() == 1;
    if (!have_all) {
      if (rank == 0) snprintf(sh->overlap, sizeof(sh->overlap), "GEMM overlap skipped: %s", why.c_str());
    } else {
      const int n = absl::GetFlag(FLAGS_gemm_n);
      cudaStream_t gs = nullptr;
      cublasHandle_t h = nullptr;
      void *A = nullptr, *B = nullptr, *C = nullptr;
      std::atomic<bool> gemm_stop{false};
      auto gemm_loop = [&](double* tflops, int* count) {
        const float alpha = 1.f, beta = 0.f;
        int k = 0;
        auto t0 = std::chrono::steady_clock::now();
        double el = 0;
        do {
          for (int j = 0; j < 4; ++j) {
            cb.gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n, &beta, C,
                    CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          }
          cudaStreamSynchronize(gs);
          k += 4;
          el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        } while (!gemm_stop.load());
        *tflops = 2.0 * n * double(n) * n * k / el / 1e12;
        *count = k;
      };
      double gemm_alone = 0, gemm_with = 0, ag_alone = 0, ag_with = 0;
      int g1 = 0, g2 = 0, a1 = 0, a2 = 0;
      bool ok = true;
      if (rank == 0) {
        CUDA_OR_RETURN(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
        const size_t elems = size_t(n) * n;
        CUDA_OR_RETURN(cudaMalloc(&A, elems * 2));
        CUDA_OR_RETURN(cudaMalloc(&B, elems * 2));
        CUDA_OR_RETURN(cudaMalloc(&C, elems * 2));
        dmagather::kernels::FillRandomBf16(A, elems, 11, gs);
        dmagather::kernels::FillRandomBf16(B, elems, 12, gs);
        cb.create(&h);
        cb.set_stream(h, gs);
        {
          const float alpha = 1.f, beta = 0.f;
          cublasStatus_t cs = cb.gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A, CUDA_R_16BF, n, B, CUDA_R_16BF,
                                      n, &beta, C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          if (cs != CUBLAS_STATUS_SUCCESS || cudaStreamSynchronize(gs) != cudaSuccess) {
            std::cerr << "rank 0: cublasGemmEx failed (status " << int(cs) << ")\n";
            sh->rank_errors++;
          }
        }
        // Warm-up, then GEMM alone.
        gemm_stop = true;
        double t;
        int c;
        gemm_loop(&t, &c);
        gemm_stop = false;
        std::thread stopper([&] {
          usleep(useconds_t(phase_s * 1e6));
          gemm_stop = true;
        });
        gemm_loop(&gemm_alone, &g1);
        stopper.join();
      }
      // AllGather alone.
      if (rank == 0) sh->stop.store(0);
      Barrier(sh, world);
      ok &= ag_loop(phase_s, &ag_alone, &a1);
      Barrier(sh, world);
      // Both at once: GEMMs in rank 0's second stream for the whole phase.
      if (rank == 0) sh->stop.store(0);
      Barrier(sh, world);
      std::thread gemm_thread;
      if (rank == 0) {
        gemm_stop = false;
        gemm_thread = std::thread([&] { gemm_loop(&gemm_with, &g2); });
      }
      ok &= ag_loop(phase_s, &ag_with, &a2);
      if (rank == 0) {
        gemm_stop = true;
        gemm_thread.join();
        snprintf(sh->overlap, sizeof(sh->overlap),
                 "| cuBLAS bf16 %d^3 GEMM in rank 0 | TF/s | AllGather %d x %d MiB bf16 | algo GB/s (ops) |\n"
                 "|---|---|---|---|\n"
                 "| GEMM alone | %.0f | AllGather alone | %.1f (%d) |\n"
                 "| GEMM + AllGathers | %.0f (%+.0f%%) | AllGathers + GEMM | %.1f (%d) (%+.0f%%) |",
                 n, world, absl::GetFlag(FLAGS_overlap_mib), gemm_alone, ag_alone, a1, gemm_with,
                 100.0 * (gemm_with / gemm_alone - 1), ag_with, a2, 100.0 * (ag_with / ag_alone - 1));
        (void)g1;
      }
      if (!ok) {
        std::cerr << "rank " << rank << ": overlap: " << comm.error() << "\n";
        sh->rank_errors++;
      }
      Barrier(sh, world);
    }
  }

  if (rank == 0) FetchTelemetry(job, sh);
  Barrier(sh, world);
  comm.Free(sendbuf);
  comm.Free(recvbuf);
  return 0;
}

#else  // !DMAGATHER_WITH_CUDA

int RunRankCuda(dmagather::Comm& comm, const std::string&, Shared* sh) {
  std::cerr << "rank " << comm.rank() << ": dmagatherd runs the cuda backend, but this allgather_perf was built "
            << "without the CUDA toolkit\n";
  sh->rank_errors++;
  return 5;
}

#endif  // DMAGATHER_WITH_CUDA

int RunRank(int rank, int world, const std::string& job, Shared* sh) {
#if DMAGATHER_WITH_CUDA
  // One rank per GPU where there are several (round-robin); on a machine
  // without a driver this fails quietly and the daemon decides the backend.
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 1) cudaSetDevice(rank % devices);
#endif
  dmagather::Comm comm(absl::GetFlag(FLAGS_socket).empty() ? nullptr : absl::GetFlag(FLAGS_socket).c_str(), job, world,
                       rank);
  if (!comm.ok()) {
    std::cerr << "rank " << rank << ": " << dmagather_status_string(comm.init_status()) << ": " << comm.error() << "\n";
    return 3;
  }
  if (rank == 0) {
    snprintf(sh->backend, sizeof(sh->backend), "%s", comm.backend().c_str());
    snprintf(sh->version, sizeof(sh->version), "%s", dmagather_version());
  }
  if (comm.backend() == "cuda") return RunRankCuda(comm, job, sh);
  const std::vector<size_t> counts = ParseList(absl::GetFlag(FLAGS_check_counts));
  const std::vector<Row> rows = BandwidthRows();
  const size_t max_shard = LargestShard(counts, rows);
  char *sendbuf = nullptr, *recvbuf = nullptr;
  if (!AllocBuffers(comm, max_shard, &sendbuf, &recvbuf)) return 3;

  // --- Correctness ---
  std::vector<char> expect;
  uint64_t seed = 0x5eed;
  for (int d = 0; d < DMAGATHER_NUM_DTYPES; ++d) {
    for (size_t count : counts) {
      for (Variant variant : dmagather::support::kAllVariants) {
        std::string why;
        ++seed;
        if (rank == 0) sh->check_ran[d]++;
        if (!CheckAllGather(comm, sendbuf, recvbuf, static_cast<dmagather_dtype_t>(d), count, variant, seed, &expect,
                            &why)) {
          Fail(sh, d, why);
        }
      }
    }
  }

  // --- Bandwidth ---
  const int iters = std::min(absl::GetFlag(FLAGS_iters), kMaxIters);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    const size_t shard = row.count * dmagather_dtype_size(row.dtype);
    FillPattern(recvbuf + rank * shard, shard, seed + i, rank);
    char* send = recvbuf + rank * shard;  // In place, as ZeRO-3/FSDP2 lay it out.
    const bool ok = TimeRow(comm, sh, i, iters, [&] {
      dmagather_status_t st = comm.AllGather(send, recvbuf, row.count, row.dtype);
      return st == DMAGATHER_OK ? comm.Wait() : st;
    });
    if (!ok) return 4;
  }
  comm.Free(sendbuf);
  comm.Free(recvbuf);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("allgather_perf [--ranks=N] [--socket=PATH]: dmagather correctness + bandwidth table");
  absl::ParseCommandLine(argc, argv);
  const int single = absl::GetFlag(FLAGS_rank);
  const int world = single >= 0 ? absl::GetFlag(FLAGS_world) : absl::GetFlag(FLAGS_ranks);
  if (world < 1 || world > kMaxRanks) {
    std::cerr << "ranks must be 1.." << kMaxRanks << "\n";
    return 2;
  }
  std::string job = absl::GetFlag(FLAGS_job);
  if (job.empty()) job = absl::StrFormat("perf-%d", getpid());
  auto* sh =
      static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (sh == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  if (single >= 0) return RunRank(single, world, job, sh);

  std::vector<pid_t> kids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(RunRank(r, world, job, sh));
    kids.push_back(pid);
  }
  int bad = 0;
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++bad;
  }
  if (bad != 0 && sh->backend[0] == '\0') {
    std::cerr << bad << " rank(s) failed before the run started\n";
    return 1;
  }

  std::printf("backend: %s (dmagatherd %s), %d ranks\n", sh->backend, sh->version, world);
  std::printf("--- Correctness ---\n");
  bool all_ok = bad == 0;
  for (int d = 0; d < DMAGATHER_NUM_DTYPES; ++d) {
    bool ok = sh->check_failed[d] == 0 && sh->check_ran[d] > 0;
    all_ok &= ok;
    std::printf("%-9s %s  (%d checks: out-of-place, in-place, list, offsets; counts %s)\n",
                dmagather_dtype_name(static_cast<dmagather_dtype_t>(d)), ok ? "PASSED" : "FAILED", sh->check_ran[d],
                absl::GetFlag(FLAGS_check_counts).c_str());
  }
  std::printf("--- Bandwidth ---\n");
  std::printf("%-9s %10s %10s %10s %10s %12s\n", "dtype", "data_MB", "avg_ms", "min_ms", "max_ms", "algo_BW");
  std::string csv = "backend,ranks,dtype,data_MB,avg_ms,min_ms,max_ms,algo_BW_GBps\n";
  const std::vector<Row> rows = BandwidthRows();
  const int iters = std::min(absl::GetFlag(FLAGS_iters), kMaxIters);
  for (size_t i = 0; i < rows.size() && bad == 0; ++i) {
    double sum = 0, mn = 1e30, mx = 0;
    for (int it = 0; it < iters; ++it) {
      double t = 0;  // An iteration takes as long as its slowest rank.
      for (int r = 0; r < world; ++r) t = std::max(t, sh->iter_ms[i][it][r]);
      sum += t;
      mn = std::min(mn, t);
      mx = std::max(mx, t);
    }
    const double avg = sum / iters;
    const double data_mb = double(rows[i].count * dmagather_dtype_size(rows[i].dtype) * world) / 1e6;
    const double bw = data_mb / 1e3 / (avg / 1e3);
    const char* dn = dmagather_dtype_name(rows[i].dtype);
    std::printf("%-9s %10.2f %10.3f %10.3f %10.3f %12.2f\n", dn, data_mb, avg, mn, mx, bw);
    csv += absl::StrFormat("%s,%d,%s,%.3f,%.4f,%.4f,%.4f,%.3f\n", sh->backend, world, dn, data_mb, avg, mn, mx, bw);
  }
  if (std::string(sh->backend) == "cuda" && bad == 0) {
    std::printf("--- End-to-end latency (submit -> stream synchronize) vs in-process cudaMemcpyAsync ---\n");
    std::printf("%12s %14s %14s %12s %22s\n", "shard_KiB", "e2e_p50_us", "e2e_p99_us", "moved_MB",
                "memcpy_same_bytes_us");
    for (int i = 0; i < sh->latency_rows; ++i) {
      const double moved = sh->lat_shard_kib[i] * 1024 * world * (world - 1) / 1e6;
      std::printf("%12.0f %14.1f %14.1f %12.3f %22.1f\n", sh->lat_shard_kib[i], sh->lat_p50_us[i], sh->lat_p99_us[i],
                  moved, sh->memcpy_p50_us[i]);
    }
    std::printf("--- Telemetry ---\n%s\n", sh->telemetry);
    if (sh->overlap[0] != '\0') std::printf("--- GEMM + AllGather overlap ---\n%s\n", sh->overlap);
  }
  if (all_ok) {
    std::printf("Result: All correctness tests PASSED\n");
  } else {
    std::printf("Result: correctness FAILED: %s\n",
                sh->first_failure[0] ? sh->first_failure : "a rank exited with an error");
  }
  const std::string path = absl::GetFlag(FLAGS_csv);
  if (!path.empty() && bad == 0) {
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    std::ofstream f(path);
    f << csv;
    if (f.good()) {
      std::printf("CSV: %s\n", path.c_str());
    } else {
      std::printf("CSV: could not write %s\n", path.c_str());
    }
  }
  return all_ok ? 0 : 1;
}

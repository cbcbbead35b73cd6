// What it costs the host to issue one small AllGather's copy work, for each
// way the CUDA runtime offers: one cudaMemcpyAsync per copy, one
// cudaMemcpyBatchAsync per op, a CUDA graph of the op's copies built once
// and launched per op (independent nodes, or a chain: each after the one
// before), and a graph whose copy addresses are updated before each launch;
// and what building a graph costs. With and without the ready
// waits (cuStreamBatchMemOp) and the end-of-op event around the copies, as
// the engine issues them.
//
// Memory is what the daemon copies: one allocation of another process
// opened with cudaIpcOpenMemHandle (a forked child allocates and exports it);
// a local cudaMalloc for comparison. Every variant's copies are checked
// bit-exact once. No kernel is launched.
//
//   issue_cost [--iters=2000] [--shard_kib=4] [--ranks=4,8] [--csv=FILE]
//
// Prints one row per (ranks, variant): host time per op p50/p99 and per
// copy, and the device time of one op issued alone.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/cuda/cuda_api.h"

ABSL_FLAG(int, iters, 2000, "Timed ops per variant.");
ABSL_FLAG(int, shard_kib, 4, "Bytes per copy (KiB).");
ABSL_FLAG(std::string, ranks, "4,8", "Ranks per op (an op is ranks x (ranks - 1) copies).");
ABSL_FLAG(std::string, csv, "", "Write the table here as CSV too.");

namespace {

using dmagather::common::cuda::DriverApi;

#define CHECK_CUDA(call)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)
#define CHECK_CU(call)                                                                                  \
  do {                                                                                                  \
    CUresult r_ = (call);                                                                               \
    if (r_ != CUDA_SUCCESS) {                                                                           \
      std::fprintf(stderr, "%s:%d %s: CUresult %d\n", __FILE__, __LINE__, #call, static_cast<int>(r_)); \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

constexpr size_t kArena = size_t{256} << 20;

struct Op {
  std::vector<void*> dst;
  std::vector<void*> src;
  std::vector<size_t> bytes;
};

// ranks x (ranks-1) copies of `shard` bytes: rank r's shard into every other
// rank's output; outputs start at `half` (alternate = the second set of
// outputs, for the address-update variant).
Op MakeOp(char* base, int ranks, size_t shard, bool alternate) {
  Op op;
  const size_t out_base = kArena / 2 + (alternate ? kArena / 4 : 0);
  for (int d = 0; d < ranks; ++d) {
    for (int s = 0; s < ranks; ++s) {
      if (s == d) continue;
      op.src.push_back(base + static_cast<size_t>(s) * shard);
      op.dst.push_back(base + out_base + (static_cast<size_t>(d) * ranks + s) * shard);
      op.bytes.push_back(shard);
    }
  }
  return op;
}

cudaMemcpyAttributes BatchAttr() {
  cudaMemcpyAttributes attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.srcLocHint.type = cudaMemLocationTypeDevice;
  attr.dstLocHint.type = cudaMemLocationTypeDevice;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  return attr;
}

void IssueBatch(const Op& op, cudaStream_t s) {
  cudaMemcpyAttributes attr = BatchAttr();
  size_t idx = 0;
  CHECK_CUDA(cudaMemcpyBatchAsync(const_cast<void**>(op.dst.data()), const_cast<void**>(op.src.data()), op.bytes.data(),
                                  op.dst.size(), &attr, &idx, 1, s));
}

// A graph of memcpy nodes, one per copy: independent, or each after the
// one before (`chain`). The graph is kept (*graph) while its nodes are
// updated in the executable.
cudaGraphExec_t BuildGraph(const Op& op, bool chain, cudaGraph_t* graph, std::vector<cudaGraphNode_t>* nodes) {
  CHECK_CUDA(cudaGraphCreate(graph, 0));
  nodes->clear();
  for (size_t i = 0; i < op.dst.size(); ++i) {
    cudaGraphNode_t n;
    const bool dep = chain && !nodes->empty();
    CHECK_CUDA(cudaGraphAddMemcpyNode1D(&n, *graph, dep ? &nodes->back() : nullptr, dep ? 1 : 0, op.dst[i], op.src[i],
                                        op.bytes[i], cudaMemcpyDeviceToDevice));
    nodes->push_back(n);
  }
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, *graph, 0));
  return exec;
}

// The same op captured from the calls the engine makes: the ready waits
// (constant value) and the batch copy.
cudaGraphExec_t CaptureGraph(const DriverApi* api, const Op& op, cudaStream_t s,
                             const std::vector<CUstreamBatchMemOpParams>& waits) {
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  CHECK_CU(api->cuStreamBatchMemOp(reinterpret_cast<CUstream>(s), waits.size(),
                                   const_cast<CUstreamBatchMemOpParams*>(waits.data()), 0));
  cudaMemcpyAttributes attr = BatchAttr();
  size_t idx = 0;
  const cudaError_t batch = cudaMemcpyBatchAsync(const_cast<void**>(op.dst.data()), const_cast<void**>(op.src.data()),
                                                 op.bytes.data(), op.dst.size(), &attr, &idx, 1, s);
  if (batch != cudaSuccess) {  // Not capturable here: one captured cudaMemcpyAsync per copy.
    std::fprintf(stderr, "capture of cudaMemcpyBatchAsync: %s; capturing cudaMemcpyAsync per copy\n",
                 cudaGetErrorString(batch));
    cudaGetLastError();
    for (size_t i = 0; i < op.dst.size(); ++i) {
      CHECK_CUDA(cudaMemcpyAsync(op.dst[i], op.src[i], op.bytes[i], cudaMemcpyDeviceToDevice, s));
    }
  }
  cudaGraph_t g;
  CHECK_CUDA(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
  CHECK_CUDA(cudaGraphDestroy(g));
  return exec;
}

struct Row {
  int ranks;
  std::string variant;
  std::string calls;
  double p50_us, p99_us, per_copy_us;
  double gpu_us;  // Device time of one op issued alone (events around it), p50.
  std::string check;
};

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

// Times `issue` (host side only) `iters` times; drains the stream every 8
// ops, outside the timing.
std::pair<double, double> Time(int iters, cudaStream_t s, const std::function<void(int)>& issue) {
  for (int i = 0; i < 50; ++i) issue(i);
  CHECK_CUDA(cudaStreamSynchronize(s));
  std::vector<double> us;
  us.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    issue(i);
    auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (i % 8 == 7) CHECK_CUDA(cudaStreamSynchronize(s));
  }
  CHECK_CUDA(cudaStreamSynchronize(s));
  return {Percentile(us, 0.5), Percentile(us, 0.99)};
}

// Device time of one op: timing events around it, issued on an idle
// stream, p50 of 200.
double GpuTime(cudaStream_t s, const std::function<void(int)>& issue) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<double> us;
  for (int i = 0; i < 200; ++i) {
    CHECK_CUDA(cudaEventRecord(a, s));
    issue(i);
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    us.push_back(ms * 1000.0);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  return Percentile(us, 0.5);
}

// Fills the sources with a pattern, poisons both output sets, runs `issue`
// once, and compares every copied byte; "ok" or what is wrong.
std::string Check(char* base, const Op& op, const Op& alt, int ranks, size_t shard, cudaStream_t s,
                  const std::function<void()>& issue, bool expect_alt) {
  std::vector<unsigned char> pattern(ranks * shard);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>((i * 131 + 7) ^ (i >> 9));
  CHECK_CUDA(cudaMemcpy(base, pattern.data(), pattern.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(base + kArena / 2, 0xA5, kArena / 2));
  CHECK_CUDA(cudaDeviceSynchronize());
  issue();
  CHECK_CUDA(cudaStreamSynchronize(s));
  const Op& want = expect_alt ? alt : op;
  std::vector<unsigned char> got(shard);
  for (size_t i = 0; i < want.dst.size(); ++i) {
    CHECK_CUDA(cudaMemcpy(got.data(), want.dst[i], shard, cudaMemcpyDeviceToHost));
    const size_t off = static_cast<char*>(want.src[i]) - base;
    if (std::memcmp(got.data(), pattern.data() + off, shard) != 0) return "WRONG copy " + std::to_string(i);
  }
  return "ok";
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int iters = absl::GetFlag(FLAGS_iters);
  const size_t shard = static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_shard_kib))) << 10;
  std::vector<int> rank_counts;
  for (absl::string_view rs : absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',', absl::SkipEmpty())) {
    int ranks = 0;
    // Inputs sit in the arena's first half, two sets of outputs (ranks^2
    // shards each) in its second.
    if (!absl::SimpleAtoi(rs, &ranks) || ranks < 2 || size_t(ranks) * ranks * shard > kArena / 4) {
      std::fprintf(stderr, "issue_cost: --ranks=%s: each entry >= 2 with ranks^2 x shard <= %zu MiB\n",
                   std::string(rs).c_str(), kArena / 4 >> 20);
      return 2;
    }
    rank_counts.push_back(ranks);
  }
  if (iters < 1 || shard == 0 || rank_counts.empty()) {
    std::fprintf(stderr, "issue_cost: --iters >= 1, --shard_kib >= 1 and at least one rank count\n");
    return 2;
  }

  // The exporting process: allocates before this process touches CUDA.
  int to_parent[2], to_child[2];
  if (pipe(to_parent) != 0 || pipe(to_child) != 0) return 1;
  pid_t child = fork();
  if (child == 0) {
    close(to_parent[0]);
    close(to_child[1]);
    void* p = nullptr;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&p, kArena));
    cudaIpcMemHandle_t h;
    CHECK_CUDA(cudaIpcGetMemHandle(&h, p));
    if (write(to_parent[1], &h, sizeof(h)) != sizeof(h)) _exit(1);
    char c;
    while (read(to_child[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(to_parent[1]);
  close(to_child[0]);
  cudaIpcMemHandle_t h;
  if (read(to_parent[0], &h, sizeof(h)) != sizeof(h)) {
    std::fprintf(stderr, "exporter failed\n");
    return 1;
  }
  CHECK_CUDA(cudaSetDevice(0));
  auto api_or = dmagather::common::cuda::Driver();
  if (!api_or.ok()) {
    std::fprintf(stderr, "%s\n", std::string(api_or.status().message()).c_str());
    return 1;
  }
  const DriverApi* api = *api_or;
  void* ipc = nullptr;
  CHECK_CUDA(cudaIpcOpenMemHandle(&ipc, h, cudaIpcMemLazyEnablePeerAccess));
  void* local = nullptr;
  CHECK_CUDA(cudaMalloc(&local, kArena));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  // Ready flags as the daemon has them: mapped pinned host words, already
  // at the value waited for (so the waits pass at once).
  uint32_t* flags_host = nullptr;
  CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&flags_host), 4096, cudaHostAllocMapped | cudaHostAllocPortable));
  for (int i = 0; i < 1024; ++i) flags_host[i] = 1;
  void* flags_dev = nullptr;
  CHECK_CUDA(cudaHostGetDevicePointer(&flags_dev, flags_host, 0));

  std::vector<Row> rows;
  for (const int ranks : rank_counts) {
    char* base = static_cast<char*>(ipc);
    const Op op = MakeOp(base, ranks, shard, false);
    const Op alt = MakeOp(base, ranks, shard, true);
    const Op lop = MakeOp(static_cast<char*>(local), ranks, shard, false);
    const size_t n = op.dst.size();
    std::vector<CUstreamBatchMemOpParams> waits(ranks);
    for (int r = 0; r < ranks; ++r) {
      std::memset(&waits[r], 0, sizeof(waits[r]));
      waits[r].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
      waits[r].waitValue.address = reinterpret_cast<CUdeviceptr>(static_cast<uint32_t*>(flags_dev) + r * 16);
      waits[r].waitValue.value = 1;
      waits[r].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    }
    auto wait_all = [&] {
      CHECK_CU(api->cuStreamBatchMemOp(reinterpret_cast<CUstream>(s), waits.size(), waits.data(), 0));
    };
    std::vector<cudaGraphNode_t> nodes, chain_nodes, upd_nodes;
    cudaGraph_t graph_def, chain_def, upd_def;
    cudaGraphExec_t graph = BuildGraph(op, false, &graph_def, &nodes);
    // What building a chain costs (create, add the nodes, instantiate).
    std::vector<double> build_us;
    for (int i = 0; i < 20; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      cudaGraph_t g;
      std::vector<cudaGraphNode_t> gn;
      cudaGraphExec_t e = BuildGraph(op, true, &g, &gn);
      build_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      CHECK_CUDA(cudaGraphExecDestroy(e));
      CHECK_CUDA(cudaGraphDestroy(g));
    }
    cudaGraphExec_t chain = BuildGraph(op, true, &chain_def, &chain_nodes);
    cudaGraphExec_t upd = BuildGraph(op, true, &upd_def, &upd_nodes);
    cudaGraphExec_t captured = CaptureGraph(api, op, s, waits);
    auto memcpy_loop = [&](const Op& o) {
      for (size_t i = 0; i < o.dst.size(); ++i) {
        CHECK_CUDA(cudaMemcpyAsync(o.dst[i], o.src[i], o.bytes[i], cudaMemcpyDeviceToDevice, s));
      }
    };
    auto update = [&](const Op& o) {
      for (size_t i = 0; i < upd_nodes.size(); ++i) {
        CHECK_CUDA(cudaGraphExecMemcpyNodeSetParams1D(upd, upd_nodes[i], o.dst[i], o.src[i], o.bytes[i],
                                                      cudaMemcpyDeviceToDevice));
      }
    };
    const std::string nc = std::to_string(n);
    struct Variant {
      std::string name, calls;
      std::function<void(int)> issue;
      bool alt_last;  // the check's single issue writes the alternate outputs
    };
    std::vector<Variant> variants = {
        {"memcpy_loop", nc + " x cudaMemcpyAsync", [&](int) { memcpy_loop(op); }, false},
        {"batch", "1 x cudaMemcpyBatchAsync", [&](int) { IssueBatch(op, s); }, false},
        {"batch_local_memory", "1 x cudaMemcpyBatchAsync (cudaMalloc, not IPC)", [&](int) { IssueBatch(lop, s); },
         false},
        {"graph", "1 x cudaGraphLaunch (" + nc + " memcpy nodes)", [&](int) { CHECK_CUDA(cudaGraphLaunch(graph, s)); },
         false},
        {"graph_chain", "1 x cudaGraphLaunch (" + nc + " memcpy nodes in a chain)",
         [&](int) { CHECK_CUDA(cudaGraphLaunch(chain, s)); }, false},
        {"graph_update", nc + " x cudaGraphExecMemcpyNodeSetParams1D + launch (chain)",
         [&](int i) {
           update((i & 1) ? alt : op);
           CHECK_CUDA(cudaGraphLaunch(upd, s));
         },
         true},
        {"full_today", "cuStreamBatchMemOp + cudaMemcpyBatchAsync + cudaEventRecord",
         [&](int) {
           wait_all();
           IssueBatch(op, s);
           CHECK_CUDA(cudaEventRecord(ev, s));
         },
         false},
        {"full_graph", "cuStreamBatchMemOp + cudaGraphLaunch + cudaEventRecord",
         [&](int) {
           wait_all();
           CHECK_CUDA(cudaGraphLaunch(graph, s));
           CHECK_CUDA(cudaEventRecord(ev, s));
         },
         false},
        {"full_chain", "cuStreamBatchMemOp + cudaGraphLaunch (chain) + cudaEventRecord",
         [&](int) {
           wait_all();
           CHECK_CUDA(cudaGraphLaunch(chain, s));
           CHECK_CUDA(cudaEventRecord(ev, s));
         },
         false},
        {"full_captured", "cudaGraphLaunch (waits + copies captured) + cudaEventRecord",
         [&](int) {
           CHECK_CUDA(cudaGraphLaunch(captured, s));
           CHECK_CUDA(cudaEventRecord(ev, s));
         },
         false},
        {"waits_only", "cuStreamBatchMemOp (" + std::to_string(ranks) + " waits)", [&](int) { wait_all(); }, false},
        {"event_only", "cudaEventRecord", [&](int) { CHECK_CUDA(cudaEventRecord(ev, s)); }, false},
    };
    for (const Variant& v : variants) {
      auto [p50, p99] = Time(iters, s, v.issue);
      std::string check = "-";
      if (v.name != "waits_only" && v.name != "event_only") {
        char* cbase = v.name == "batch_local_memory" ? static_cast<char*>(local) : base;
        const Op& cop = v.name == "batch_local_memory" ? lop : op;
        const Op calt = v.name == "batch_local_memory" ? lop : alt;
        check = Check(
            cbase, cop, calt, ranks, shard, s, [&] { v.issue(v.alt_last ? 1 : 0); }, v.alt_last);
      }
      const double gpu = GpuTime(s, v.issue);
      rows.push_back({ranks, v.name, v.calls, p50, p99, p50 / n, gpu, check});
      std::fprintf(stderr, "ranks=%d %-20s p50 %8.2f us  p99 %8.2f us  gpu %8.2f us  check %s\n", ranks, v.name.c_str(),
                   p50, p99, gpu, check.c_str());
    }
    CHECK_CUDA(cudaGraphExecDestroy(graph));
    CHECK_CUDA(cudaGraphExecDestroy(chain));
    CHECK_CUDA(cudaGraphExecDestroy(upd));
    CHECK_CUDA(cudaGraphDestroy(upd_def));
    rows.push_back({ranks, "graph_build_chain", "cudaGraphCreate + " + nc + " x AddMemcpyNode1D + Instantiate",
                    Percentile(build_us, 0.5), Percentile(build_us, 0.99), Percentile(build_us, 0.5) / n, 0, "-"});
    CHECK_CUDA(cudaGraphDestroy(graph_def));
    CHECK_CUDA(cudaGraphDestroy(chain_def));
    CHECK_CUDA(cudaGraphExecDestroy(captured));
  }

  std::printf("%-6s %-7s %-18s %11s %11s %12s %10s %-6s  %s\n", "ranks", "copies", "variant", "host_p50_us",
              "host_p99_us", "p50_per_copy", "gpu_p50_us", "check", "calls per op");
  for (const Row& r : rows) {
    std::printf("%-6d %-7d %-18s %11.2f %11.2f %12.2f %10.2f %-6s  %s\n", r.ranks, r.ranks * (r.ranks - 1),
                r.variant.c_str(), r.p50_us, r.p99_us, r.per_copy_us, r.gpu_us, r.check.c_str(), r.calls.c_str());
  }
  const std::string csv = absl::GetFlag(FLAGS_csv);
  if (!csv.empty()) {
    FILE* f = std::fopen(csv.c_str(), "w");
    if (f != nullptr) {
      std::fprintf(f, "ranks,copies,shard_bytes,variant,host_p50_us,host_p99_us,p50_per_copy_us,gpu_p50_us,check\n");
      for (const Row& r : rows) {
        std::fprintf(f, "%d,%d,%zu,%s,%.3f,%.3f,%.3f,%.3f,%s\n", r.ranks, r.ranks * (r.ranks - 1), shard,
                     r.variant.c_str(), r.p50_us, r.p99_us, r.per_copy_us, r.gpu_us, r.check.c_str());
      }
      std::fclose(f);
    }
  }
  close(to_child[1]);
  waitpid(child, nullptr, 0);
  bool ok = true;
  for (const Row& r : rows) ok = ok && (r.check == "ok" || r.check == "-");
  return ok ? 0 : 1;
}

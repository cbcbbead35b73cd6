// The cuda runtime's copy graphs (cuda_graphs.h).
#include "server/engines/gpu/cuda/cuda_graphs.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_api.h"
#include "common/status.h"

namespace dmagather::server::engines::gpu::cuda {
namespace {

using ::dmagather::common::cuda::CudaStatus;

// A copy graph: the executable, and the graph it was instantiated from with
// its nodes (cudaGraphExecMemcpyNodeSetParams1D names a node of that graph).
struct CudaCopyGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<cudaGraphNode_t> nodes;  // Node i copies chunk i.

  ~CudaCopyGraph() {
    // An executable still in flight is freed by the driver when it completes.
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

CudaCopyGraph* Of(CopyGraphCache::Graph g) { return static_cast<CudaCopyGraph*>(g); }

// A graph of the chunks as memcpy nodes in one chain, chunk i after chunk
// i - 1: a chain launches in ~1.2-2.3 us whatever its length, where
// independent nodes cost ~1 us each (the driver fans them out over internal
// streams).
absl::StatusOr<CopyGraphCache::Graph> BuildGraph(const CopyCmd* chunks, size_t n) {
  auto g = std::make_unique<CudaCopyGraph>();
  DMAG_CUDA_RETURN_IF_ERROR(cudaGraphCreate(&g->graph, 0));
  g->nodes.assign(n, nullptr);
  cudaError_t err = cudaSuccess;
  for (size_t i = 0; i < n && err == cudaSuccess; ++i) {
    const cudaGraphNode_t* dep = i >= 1 ? &g->nodes[i - 1] : nullptr;
    err = cudaGraphAddMemcpyNode1D(&g->nodes[i], g->graph, dep, dep != nullptr ? 1 : 0, chunks[i].dst, chunks[i].src,
                                   chunks[i].bytes, cudaMemcpyDeviceToDevice);
  }
  if (err == cudaSuccess) err = cudaGraphInstantiate(&g->exec, g->graph, 0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus("cudaGraphAddMemcpyNode1D/cudaGraphInstantiate", err);
  }
  return static_cast<CopyGraphCache::Graph>(g.release());
}

}  // namespace

CopyGraphCache::Ops CudaGraphOps() {
  CopyGraphCache::Ops ops;
  ops.build = BuildGraph;
  ops.launch = [](CopyGraphCache::Graph g, void* stream) {
    cudaError_t err = cudaGraphLaunch(Of(g)->exec, static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) cudaGetLastError();
    return CudaStatus("cudaGraphLaunch(copies)", err);
  };
  ops.destroy = [](CopyGraphCache::Graph g) { delete Of(g); };
  // ~0.9-1.1 us a node on an H100, against ~2-4 us a node to build and ~4 us
  // a copy in a batch (docs/PERFORMANCE.md, "A graph per shape").
  // Launches already made keep their addresses.
  ops.update = [](CopyGraphCache::Graph g, size_t node, const CopyCmd& c) {
    cudaError_t err = cudaGraphExecMemcpyNodeSetParams1D(Of(g)->exec, Of(g)->nodes[node], c.dst, c.src, c.bytes,
                                                         cudaMemcpyDeviceToDevice);
    if (err != cudaSuccess) cudaGetLastError();
    return CudaStatus("cudaGraphExecMemcpyNodeSetParams1D", err);
  };
  return ops;
}

CopyGraphCache::Options CudaGraphOptions(const CudaEngineOptions& c) {
  CopyGraphCache::Options o;
  // Largest chunk replayed (--cuda_graph_max_kib, default 1024; at least 1
  // KiB). Measured on one H200 (ranks sharing it): 4 KiB and 1 MiB copies
  // issued and ran faster from a graph; with 16 MiB shards a chain took
  // 2-3.5x longer end to end and with 64 MiB shards the p99 went from ~1.0
  // to 2.7 ms (a chain runs its copies one after another). Not yet measured
  // with ranks on several GPUs (peer copies on copy engines).
  o.max_chunk_bytes = std::max<uint64_t>(c.graph_max_chunk_bytes, 1024);
  // Calls that are their op's sole stream on the device: chains of chunks up
  // to this (--cuda_graph_sole_max_kib, default 65536; 0: the cap above for
  // them too). Measured on one H200, ranks sharing it (docs/PERFORMANCE.md,
  // "Medium ops"): ops of 4 MiB x 2-4 ranks and 16 MiB x 2 ranks issued
  // 5-10x faster and ran as fast or faster end to end as one chain; ops that
  // fan out over streams took +2.1 ms in 10-33% of cases as chains, so those
  // keep the batch path.
  o.max_sole_chunk_bytes = c.graph_sole_max_chunk_bytes;
  // Graphs per call shape, pointed at new addresses in place
  // (--cuda_graph_per_shape; 0: a graph serves its exact addresses only, a
  // call at new addresses builds one).
  o.max_per_shape = size_t(std::max(0, c.graph_per_shape));
  return o;
}

std::string DescribeCopyGraphs(const std::vector<const CopyGraphCache*>& caches) {
  int on = 0;
  uint64_t replays = 0, built = 0, dropped = 0, updated = 0, nodes_updated = 0, max_chunk = 0, max_sole = 0;
  bool updates_on = false;
  for (const CopyGraphCache* c : caches) {
    on += c->enabled() ? 1 : 0;
    replays += c->replays();
    built += c->built();
    dropped += c->dropped();
    updated += c->updated();
    nodes_updated += c->nodes_updated();
    updates_on = updates_on || c->updates_on();
    max_chunk = c->max_chunk_bytes();
    max_sole = c->max_sole_chunk_bytes();
  }
  if (on == 0) return "copy graphs off";
  return absl::StrCat(
      "copy graphs (a copy call seen twice is replayed as a CUDA graph, one cache per device: ", "chunks <= ",
      max_chunk >> 10, " KiB as one chain",
      max_sole > max_chunk ? absl::StrCat(" (<= ", max_sole >> 10, " KiB where the op has one stream)") : std::string(),
      ", larger chunks issued as a batch",
      updates_on ? "; a known shape at new addresses updates a graph in place" : "", "): ", replays, " replays, ",
      built, " built, ", updated, " updated in place (", nodes_updated, " nodes), ", dropped,
      " dropped by import releases");
}

void CopyPathFigures::Record(CopyGraphCache::Served path, uint64_t ns, size_t copies) {
  Figures& f = paths_[static_cast<int>(path)];
  f.ns.Record(ns);
  f.copies.fetch_add(copies, std::memory_order_relaxed);
  f.total_ns.fetch_add(ns, std::memory_order_relaxed);
}

std::string CopyPathFigures::Describe() const {
  static constexpr const char* kNames[] = {"batch", "graph replayed", "graph updated in place", "graph built"};
  std::string d;
  for (int p = 0; p < 4; ++p) {
    const common::LatencySummaryNs x = paths_[p].ns.Summary();
    if (x.count == 0) continue;
    const uint64_t copies = std::max<uint64_t>(paths_[p].copies.load(std::memory_order_relaxed), 1);
    const uint64_t total_ns = paths_[p].total_ns.load(std::memory_order_relaxed);
    absl::StrAppend(&d, d.empty() ? "" : ", ", kNames[p], " ", x.count, " calls p50 ", x.p50 / 1e3, " us (", copies,
                    " copies, ", total_ns / 1e6, " ms in all, ", total_ns / 1e3 / copies, " us a copy)");
  }
  return d.empty() ? d : absl::StrCat("; copy calls by path: ", d);
}

}  // namespace dmagather::server::engines::gpu::cuda

// The cuda runtime's copy graphs (cuda_runtime.cc): how a CopyGraphCache
// (copy_graph_cache.h) builds, launches, updates and destroys CUDA graphs of
// memcpy nodes, and its options (--cuda_graph_* flags). Called on a
// device's issuing thread. And what the daemon reports of them at exit.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/latency_histogram.h"
#include "server/engines/factory.h"
#include "server/engines/gpu/cuda/copy_graph_cache.h"

namespace dmagather::server::engines::gpu::cuda {

CopyGraphCache::Ops CudaGraphOps();
CopyGraphCache::Options CudaGraphOptions(const CudaEngineOptions& options);

// The settings and counters of every device's cache (none: "copy graphs
// off").
std::string DescribeCopyGraphs(const std::vector<const CopyGraphCache*>& caches);

// Copy calls by how they went out (not replayed: a batch; replayed; replayed
// after an update; built): their time and copies. Record from any thread.
class CopyPathFigures {
 public:
  void Record(CopyGraphCache::Served path, uint64_t ns, size_t copies);
  std::string Describe() const;  // "; copy calls by path: ..." or "".

 private:
  struct Figures {
    common::LatencyHistogram ns;
    std::atomic<uint64_t> copies{0}, total_ns{0};
  };
  Figures paths_[4];
};

}  // namespace dmagather::server::engines::gpu::cuda

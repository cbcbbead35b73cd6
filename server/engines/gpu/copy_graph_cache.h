// CopyGraphCache: replays repeated copy calls from prebuilt graphs.
//
// Issuing copies one by one costs the host a few microseconds each (cuda:
// 3.3-5 us per copy inside cudaMemcpyBatchAsync), while launching a graph of
// memcpy nodes in a chain costs ~1.2-2.3 us whatever its length
// (bench/gpu/issue_cost.cc, docs/PERFORMANCE.md). Trainers gather into the
// same buffers every step, so the same copy call (same device, addresses
// and sizes) comes back again and again. The cache keys a copy call by
// exactly that; on its second sight it builds a graph (the runtime's
// `build`), and from then on launches it (`launch`).
//
// Graphs hold addresses. Every import release (an IPC handle closed, a VMM
// range unmapped) is reported to the ReleaseLog *before* the memory goes,
// from any thread; before each lookup the issuing thread drops the graphs
// whose copies touch a released range, so a graph is never launched on an
// address that was reused for other memory. Other graphs stay.
//
// Two shapes of graph: a call whose chunks are all <= `max_chunk_bytes` is
// one chain (each copy after the one before: the cheapest launch, and small
// copies lose nothing by running in turn). So is a call of chunks up to
// `max_sole_chunk_bytes` that is its op's sole stream on the device (the
// engine fanned nothing out beside it, so a chain serialises nothing that
// would have overlapped; docs/PERFORMANCE.md, "Medium ops"). A larger call,
// with `lanes` > 0, is `lanes` chains side by side (chunk i in chain
// i % lanes): its launch costs about one chain head per lane, and its copies
// still overlap as the batch path's do. lanes = 0: larger calls are not
// replayed.
//
// Bounded: at most `max_graphs` (least recently used out) and
// `max_seen` keys seen once. A call that fails to build is not tried again;
// after `max_build_failures` such calls, or any launch failure, the cache
// turns itself off (the runtime then issues copies its other way).
//
// No GPU calls here: the runtime passes them in (Ops), so the logic is
// unit-tested on CPU (tests/server/engines/gpu/copy_graph_cache_test).
//
// Threads: Replay and the destructor on the issuing thread only; the
// ReleaseLog from any thread; the counters anywhere.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/engines/copy_engine.h"

namespace dmagather::server::engines::gpu {

// Address ranges whose memory is about to go (any thread).
class ReleaseLog {
 public:
  void Add(uint64_t base, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The ranges added since the last call (issuing thread); false if none.
  bool Take(std::vector<std::pair<uint64_t, uint64_t>>* ranges) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::atomic<bool> pending_{false};
  absl::Mutex mu_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_ ABSL_GUARDED_BY(mu_);  // [base, base + bytes).
};

class CopyGraphCache {
 public:
  using Graph = void*;
  struct Ops {
    // Chunk i after chunk i - lanes (lanes = 1: one chain).
    std::function<absl::StatusOr<Graph>(const CopyCmd* chunks, size_t n, size_t lanes)> build;
    std::function<absl::Status(Graph graph, void* stream)> launch;
    std::function<void(Graph graph)> destroy;  // May be called while a launch is in flight.
  };
  struct Options {
    uint64_t max_chunk_bytes = uint64_t{1} << 20;  // Calls of chunks up to this: one chain.
    // Calls that are their op's sole stream on the device, of chunks up to
    // this: one chain too (0: as any other call).
    uint64_t max_sole_chunk_bytes = 0;
    size_t lanes = 0;  // Calls with larger chunks: this many chains; 0: not replayed.
    size_t max_graphs = 1024;
    size_t max_seen = 16384;
    int max_build_failures = 16;
  };

  CopyGraphCache(Ops ops, Options options);
  ~CopyGraphCache();
  CopyGraphCache(const CopyGraphCache&) = delete;
  CopyGraphCache& operator=(const CopyGraphCache&) = delete;

  // Where import releases are reported (shared: regions may outlive the
  // cache).
  const std::shared_ptr<ReleaseLog>& releases() const { return releases_; }

  // Launches this copy call's graph on `stream` (building it on the call's
  // second sight). `sole_stream`: as GpuRuntime::Copy's. False: not
  // replayed; issue the copies another way.
  bool Replay(int device, void* stream, const CopyCmd* chunks, size_t n, bool sole_stream);

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  uint64_t max_chunk_bytes() const { return options_.max_chunk_bytes; }
  uint64_t max_sole_chunk_bytes() const { return options_.max_sole_chunk_bytes; }
  size_t lanes() const { return options_.lanes; }
  uint64_t replays() const { return replays_.load(std::memory_order_relaxed); }
  uint64_t built() const { return built_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  size_t size() const { return size_.load(std::memory_order_relaxed); }

 private:
  struct Entry {
    Graph graph = nullptr;
    uint64_t last_use = 0;
    std::vector<std::pair<uint64_t, uint64_t>> spans;  // Every chunk's dst and src range.
  };
  void DropReleased();
  void EvictLeastRecent();
  void DropAll();
  void Disable(const std::string& why);

  const Ops ops_;
  const Options options_;
  const std::shared_ptr<ReleaseLog> releases_ = std::make_shared<ReleaseLog>();
  absl::flat_hash_map<std::string, Entry> graphs_;
  absl::flat_hash_map<std::string, uint8_t> seen_;  // Keys seen once.
  absl::flat_hash_set<std::string> failed_;         // Keys that did not build.
  std::vector<std::pair<uint64_t, uint64_t>> released_;
  std::string key_;
  uint64_t clock_ = 0;
  int build_failures_ = 0;
  std::atomic<bool> enabled_{true};
  std::atomic<uint64_t> replays_{0}, built_{0}, dropped_{0};
  std::atomic<size_t> size_{0};
};

}  // namespace dmagather::server::engines::gpu

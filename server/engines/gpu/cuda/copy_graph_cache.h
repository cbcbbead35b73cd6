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
// Trainers' buffers move: FSDP2 allocates each unsharded parameter anew at
// every unshard, so the same op comes back with the same sizes at other
// addresses. A cache with an `update` op (the cuda runtime's: one
// cudaGraphExecMemcpyNodeSetParams1D per node, ~0.7-1.1 us, against ~2-4 us
// a node to build and ~4 us a copy in a batch) therefore also keys calls by their *shape* (device,
// every chunk's size, and the stream: a graph's launches run one after
// another, so one graph must not serve two streams that would overlap):
// a call of a known shape at new addresses points
// the shape's least recently used graph at them, only the nodes whose
// addresses changed, and launches it, instead of building a graph. An
// address set that comes back again (a second sight of the exact call) gets
// a graph of its own, up to `max_per_shape` per shape (the layers of a model
// share shapes); without `update`, or with max_per_shape = 0, a graph serves
// its exact addresses only. An update changes only launches after it
// (launches in flight keep their addresses). A failed update drops that graph
// and turns updates off (exact replays go on).
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
// would have overlapped; docs/PERFORMANCE.md, "Medium ops"). A larger call is
// not replayed (the batch path: its copies overlap).
//
// Bounded: at most `max_graphs` (least recently used out) and
// `max_seen` keys (calls and shapes) seen once. A call that fails to build is not tried again;
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

namespace dmagather::server::engines::gpu::cuda {

// Address ranges whose memory is about to go (any thread).
class ReleaseLog {
 public:
  void Add(uint64_t base, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The ranges added since the last call (issuing thread); false if none.
  bool Take(std::vector<std::pair<uint64_t, uint64_t>>* ranges) ABSL_LOCKS_EXCLUDED(mu_);
  // Ranges were added and not taken yet.
  bool pending() const { return pending_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> pending_{false};
  absl::Mutex mu_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_ ABSL_GUARDED_BY(mu_);  // [base, base + bytes).
};

class CopyGraphCache {
 public:
  using Graph = void*;
  struct Ops {
    // One chain: chunk i after chunk i - 1.
    std::function<absl::StatusOr<Graph>(const CopyCmd* chunks, size_t n)> build;
    std::function<absl::Status(Graph graph, void* stream)> launch;
    std::function<void(Graph graph)> destroy;  // May be called while a launch is in flight.
    // Points node i (chunk i of the call it was built from) of `graph` at
    // `chunk`, same size, for launches from now on. Optional: without it
    // graphs serve their exact addresses only.
    std::function<absl::Status(Graph graph, size_t node, const CopyCmd& chunk)> update;
  };
  struct Options {
    uint64_t max_chunk_bytes = uint64_t{1} << 20;  // Calls of chunks up to this: one chain.
    // Calls that are their op's sole stream on the device, of chunks up to
    // this: one chain too (0: as any other call).
    uint64_t max_sole_chunk_bytes = 0;
    // Graphs kept per call shape when `update` is given (0: exact addresses
    // only).
    size_t max_per_shape = 4;
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
  // second sight, with updates on its shape's second sight, or pointing a
  // graph of its shape at its addresses). `sole_stream`: as GpuRuntime::Copy's. False: not
  // replayed; issue the copies another way.
  bool Replay(int device, void* stream, const CopyCmd* chunks, size_t n, bool sole_stream);
  // How the last Replay served its call (issuing thread).
  enum class Served { kNot, kReplayed, kUpdated, kBuilt };
  Served last_served() const { return last_served_; }

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  uint64_t max_chunk_bytes() const { return options_.max_chunk_bytes; }
  uint64_t max_sole_chunk_bytes() const { return options_.max_sole_chunk_bytes; }
  uint64_t replays() const { return replays_.load(std::memory_order_relaxed); }
  uint64_t built() const { return built_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // Replays that pointed a graph at new addresses first, and the nodes so
  // changed.
  uint64_t updated() const { return updated_.load(std::memory_order_relaxed); }
  uint64_t nodes_updated() const { return nodes_updated_.load(std::memory_order_relaxed); }
  bool updates_on() const { return reuse_.load(std::memory_order_relaxed); }
  size_t size() const { return size_.load(std::memory_order_relaxed); }

 private:
  struct Entry {
    Graph graph = nullptr;
    uint64_t last_use = 0;
    std::string key, shape;       // Where graphs_ and shapes_ file it.
    std::vector<CopyCmd> chunks;  // The addresses it copies now (and their spans).
  };
  using Graphs = absl::flat_hash_map<std::string, std::unique_ptr<Entry>>;
  // A graph for the call under key_ / shape_ (null: not built).
  Entry* Build(const CopyCmd* chunks, size_t n);
  // `e` pointed at the call's addresses, filed under key_ (null: the update
  // failed; `e` is gone and updates are off).
  Entry* Update(Entry* e, const CopyCmd* chunks, size_t n);
  Entry* LeastRecent(const std::vector<Entry*>& among) const;  // `among` not empty.
  Entry* LeastRecent() const;                                  // Of all; graphs_ not empty.
  void Erase(Graphs::iterator it);
  void DropReleased();
  void DropAll();
  void Disable(const std::string& why);

  const Ops ops_;
  const Options options_;
  std::atomic<bool> reuse_;  // In-place updates on.
  const std::shared_ptr<ReleaseLog> releases_ = std::make_shared<ReleaseLog>();
  Graphs graphs_;                                                 // By exact call.
  absl::flat_hash_map<std::string, std::vector<Entry*>> shapes_;  // Graphs by call shape.
  absl::flat_hash_map<std::string, uint8_t> seen_;                // Calls and shapes seen once.
  absl::flat_hash_set<std::string> failed_;                       // Calls that did not build.
  std::vector<std::pair<uint64_t, uint64_t>> released_;
  std::string key_, shape_;
  Served last_served_ = Served::kNot;
  uint64_t clock_ = 0;
  int build_failures_ = 0;
  std::atomic<bool> enabled_{true};
  std::atomic<uint64_t> replays_{0}, built_{0}, dropped_{0}, updated_{0}, nodes_updated_{0};
  std::atomic<size_t> size_{0};
};

}  // namespace dmagather::server::engines::gpu::cuda

#include "server/engines/gpu/copy_graph_cache.h"

#include <glog/logging.h>

#include <algorithm>

namespace dmagather::server::engines::gpu {

void ReleaseLog::Add(uint64_t base, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  ranges_.emplace_back(base, bytes);
  pending_.store(true, std::memory_order_release);
}

bool ReleaseLog::Take(std::vector<std::pair<uint64_t, uint64_t>>* ranges) {
  ranges->clear();
  if (!pending_.load(std::memory_order_acquire)) return false;
  absl::MutexLock lock(&mu_);
  ranges->swap(ranges_);
  pending_.store(false, std::memory_order_relaxed);
  return !ranges->empty();
}

CopyGraphCache::CopyGraphCache(Ops ops, Options options) : ops_(std::move(ops)), options_(options) {}

CopyGraphCache::~CopyGraphCache() { DropAll(); }

bool CopyGraphCache::Replay(int device, void* stream, const CopyCmd* chunks, size_t n, bool sole_stream) {
  if (!enabled() || n == 0) return false;
  const uint64_t chain_cap =
      sole_stream ? std::max(options_.max_chunk_bytes, options_.max_sole_chunk_bytes) : options_.max_chunk_bytes;
  size_t lanes = 1;
  for (size_t i = 0; i < n; ++i) {
    if (chunks[i].bytes > chain_cap) lanes = options_.lanes;
  }
  if (lanes == 0) return false;  // Large chunks without lanes: the batch path.
  lanes = std::min(lanes, n);
  DropReleased();
  key_.clear();
  key_.append(reinterpret_cast<const char*>(&device), sizeof(device));
  key_.append(reinterpret_cast<const char*>(&lanes), sizeof(lanes));  // The same call, one chain or side by side.
  for (size_t i = 0; i < n; ++i) {
    const uint64_t k[3] = {reinterpret_cast<uint64_t>(chunks[i].dst), reinterpret_cast<uint64_t>(chunks[i].src),
                           chunks[i].bytes};
    key_.append(reinterpret_cast<const char*>(k), sizeof(k));
  }
  auto it = graphs_.find(key_);
  if (it == graphs_.end()) {
    if (failed_.contains(key_)) return false;
    if (seen_.size() >= options_.max_seen) seen_.clear();
    if (++seen_[key_] < 2) return false;  // First sight: a one-off is not worth a graph.
    seen_.erase(key_);
    absl::StatusOr<Graph> graph = ops_.build(chunks, n, lanes);
    if (!graph.ok()) {
      LOG(WARNING) << "copy graph not built (" << graph.status().message()
                   << "); this copy call is issued without one from now on";
      failed_.insert(key_);
      if (++build_failures_ >= options_.max_build_failures) {
        Disable("copy graphs failed to build " + std::to_string(build_failures_) + " times");
      }
      return false;
    }
    if (graphs_.size() >= options_.max_graphs) EvictLeastRecent();
    Entry e;
    e.graph = *graph;
    for (size_t i = 0; i < n; ++i) {
      e.spans.emplace_back(reinterpret_cast<uint64_t>(chunks[i].dst), chunks[i].bytes);
      e.spans.emplace_back(reinterpret_cast<uint64_t>(chunks[i].src), chunks[i].bytes);
    }
    it = graphs_.emplace(key_, std::move(e)).first;
    built_.fetch_add(1, std::memory_order_relaxed);
    size_.store(graphs_.size(), std::memory_order_relaxed);
  }
  it->second.last_use = ++clock_;
  absl::Status st = ops_.launch(it->second.graph, stream);
  if (!st.ok()) {
    Disable("launching a copy graph failed: " + std::string(st.message()));
    return false;
  }
  replays_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void CopyGraphCache::DropReleased() {
  if (!releases_->Take(&released_)) return;
  auto touches = [&](const Entry& e) {
    for (const auto& [lo, bytes] : e.spans) {
      for (const auto& [rlo, rbytes] : released_) {
        if (lo < rlo + rbytes && rlo < lo + bytes) return true;
      }
    }
    return false;
  };
  for (auto it = graphs_.begin(); it != graphs_.end();) {
    if (touches(it->second)) {
      ops_.destroy(it->second.graph);
      dropped_.fetch_add(1, std::memory_order_relaxed);
      graphs_.erase(it++);
    } else {
      ++it;
    }
  }
  // Keys seen once may name the released addresses: a new mapping there
  // gets its own two sightings.
  seen_.clear();
  size_.store(graphs_.size(), std::memory_order_relaxed);
}

void CopyGraphCache::EvictLeastRecent() {
  auto oldest = std::min_element(graphs_.begin(), graphs_.end(),
                                 [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
  ops_.destroy(oldest->second.graph);
  graphs_.erase(oldest);
}

void CopyGraphCache::DropAll() {
  for (auto& [key, e] : graphs_) ops_.destroy(e.graph);
  graphs_.clear();
  seen_.clear();
  size_.store(0, std::memory_order_relaxed);
}

void CopyGraphCache::Disable(const std::string& why) {
  LOG(WARNING) << why << "; copy graphs off from now on";
  DropAll();
  enabled_.store(false, std::memory_order_relaxed);
}

}  // namespace dmagather::server::engines::gpu

#include "server/engines/gpu/cuda/copy_graph_cache.h"

#include <glog/logging.h>

#include <algorithm>

namespace dmagather::server::engines::gpu::cuda {

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

CopyGraphCache::CopyGraphCache(Ops ops, Options options)
    : ops_(std::move(ops)), options_(options), reuse_(ops_.update != nullptr && options_.max_per_shape > 0) {}

CopyGraphCache::~CopyGraphCache() { DropAll(); }

bool CopyGraphCache::Replay(int device, void* stream, const CopyCmd* chunks, size_t n, bool sole_stream) {
  last_served_ = Served::kNot;
  if (!enabled() || n == 0) return false;
  const uint64_t chain_cap =
      sole_stream ? std::max(options_.max_chunk_bytes, options_.max_sole_chunk_bytes) : options_.max_chunk_bytes;
  for (size_t i = 0; i < n; ++i) {
    if (chunks[i].bytes > chain_cap) return false;  // Large chunks: the batch path.
  }
  DropReleased();
  // key_: 'C', device, every chunk's size and addresses; shape_: 'S', the same without the
  // addresses, and the stream: launches of one graph run one after another
  // (CUDA orders each launch after the graph's previous one), so a graph
  // that follows new addresses stays on one stream, where they would anyway.
  key_.assign(1, 'C');
  key_.append(reinterpret_cast<const char*>(&device), sizeof(device));
  shape_ = key_;
  shape_[0] = 'S';
  shape_.append(reinterpret_cast<const char*>(&stream), sizeof(stream));
  for (size_t i = 0; i < n; ++i) {
    const uint64_t k[3] = {chunks[i].bytes, reinterpret_cast<uint64_t>(chunks[i].dst),
                           reinterpret_cast<uint64_t>(chunks[i].src)};
    shape_.append(reinterpret_cast<const char*>(k), sizeof(k[0]));
    key_.append(reinterpret_cast<const char*>(k), sizeof(k));
  }
  Entry* e = nullptr;
  Served served = Served::kReplayed;
  if (auto it = graphs_.find(key_); it != graphs_.end()) {
    e = it->second.get();
  } else {
    if (failed_.contains(key_)) return false;
    if (seen_.size() >= options_.max_seen) seen_.clear();
    // First sight: a one-off is not worth a graph. With updates, a shape
    // seen before is no one-off.
    const bool again = ++seen_[key_] >= 2;
    const auto shape = reuse_ ? shapes_.find(shape_) : shapes_.end();
    const bool has_shape = shape != shapes_.end();
    const bool shape_again = reuse_ && (has_shape || ++seen_[shape_] >= 2);
    if (!again && !shape_again) return false;
    if (has_shape && !(again && shape->second.size() < options_.max_per_shape)) {
      // New addresses for a known shape: its least recently used graph
      // follows them (an address set seen again gets its own, up to the cap).
      e = Update(LeastRecent(shape->second), chunks, n);
      served = Served::kUpdated;
    } else {
      seen_.erase(key_);
      seen_.erase(shape_);
      e = Build(chunks, n);
      served = Served::kBuilt;
    }
    if (e == nullptr) return false;
  }
  e->last_use = ++clock_;
  absl::Status st = ops_.launch(e->graph, stream);
  if (!st.ok()) {
    Disable("launching a copy graph failed: " + std::string(st.message()));
    return false;
  }
  replays_.fetch_add(1, std::memory_order_relaxed);
  last_served_ = served;
  return true;
}

CopyGraphCache::Entry* CopyGraphCache::Build(const CopyCmd* chunks, size_t n) {
  absl::StatusOr<Graph> graph = ops_.build(chunks, n);
  if (!graph.ok()) {
    LOG(WARNING) << "copy graph not built (" << graph.status().message()
                 << "); this copy call is issued without one from now on";
    failed_.insert(key_);
    if (++build_failures_ >= options_.max_build_failures) {
      Disable("copy graphs failed to build " + std::to_string(build_failures_) + " times");
    }
    return nullptr;
  }
  if (graphs_.size() >= options_.max_graphs) Erase(graphs_.find(LeastRecent()->key));
  auto e = std::make_unique<Entry>();
  e->graph = *graph;
  e->key = key_;
  e->shape = shape_;
  e->chunks.assign(chunks, chunks + n);
  Entry* raw = e.get();
  graphs_.emplace(key_, std::move(e));
  shapes_[shape_].push_back(raw);
  built_.fetch_add(1, std::memory_order_relaxed);
  size_.store(graphs_.size(), std::memory_order_relaxed);
  return raw;
}

CopyGraphCache::Entry* CopyGraphCache::Update(Entry* e, const CopyCmd* chunks, size_t n) {
  uint64_t changed = 0;
  for (size_t i = 0; i < n; ++i) {
    CopyCmd& old = e->chunks[i];
    if (old.dst == chunks[i].dst && old.src == chunks[i].src) continue;
    if (absl::Status st = ops_.update(e->graph, i, chunks[i]); !st.ok()) {
      LOG(WARNING) << "copy graph not updated (" << st.message()
                   << "); copy graphs serve their exact addresses only from now on";
      reuse_.store(false, std::memory_order_relaxed);
      Erase(graphs_.find(e->key));  // Half updated: gone.
      size_.store(graphs_.size(), std::memory_order_relaxed);
      return nullptr;
    }
    old = chunks[i];
    ++changed;
  }
  auto node = graphs_.extract(e->key);
  node.key() = e->key = key_;
  graphs_.insert(std::move(node));
  updated_.fetch_add(1, std::memory_order_relaxed);
  nodes_updated_.fetch_add(changed, std::memory_order_relaxed);
  return e;
}

CopyGraphCache::Entry* CopyGraphCache::LeastRecent(const std::vector<Entry*>& among) const {
  const auto older = [](const Entry* a, const Entry* b) { return a->last_use < b->last_use; };
  return *std::min_element(among.begin(), among.end(), older);
}

CopyGraphCache::Entry* CopyGraphCache::LeastRecent() const {
  Entry* best = nullptr;
  for (const auto& [key, e] : graphs_) {
    if (best == nullptr || e->last_use < best->last_use) best = e.get();
  }
  return best;
}

void CopyGraphCache::Erase(Graphs::iterator it) {
  Entry* e = it->second.get();
  auto same = shapes_.find(e->shape);
  if (same != shapes_.end()) {
    same->second.erase(std::find(same->second.begin(), same->second.end(), e));
    if (same->second.empty()) shapes_.erase(same);
  }
  ops_.destroy(e->graph);
  graphs_.erase(it);
}

void CopyGraphCache::DropReleased() {
  if (!releases_->Take(&released_)) return;
  auto touches = [&](const Entry& e) {
    for (const CopyCmd& c : e.chunks) {
      for (uint64_t lo : {reinterpret_cast<uint64_t>(c.dst), reinterpret_cast<uint64_t>(c.src)}) {
        for (const auto& [rlo, rbytes] : released_) {
          if (lo < rlo + rbytes && rlo < lo + c.bytes) return true;
        }
      }
    }
    return false;
  };
  for (auto it = graphs_.begin(); it != graphs_.end();) {
    if (touches(*it->second)) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      Erase(it++);
    } else {
      ++it;
    }
  }
  // Calls seen once may name the released addresses: a new mapping there
  // gets its own two sightings.
  seen_.clear();
  size_.store(graphs_.size(), std::memory_order_relaxed);
}

void CopyGraphCache::DropAll() {
  for (auto& [key, e] : graphs_) ops_.destroy(e->graph);
  graphs_.clear();
  shapes_.clear();
  seen_.clear();
  size_.store(0, std::memory_order_relaxed);
}

void CopyGraphCache::Disable(const std::string& why) {
  LOG(WARNING) << why << "; copy graphs off from now on";
  DropAll();
  enabled_.store(false, std::memory_order_relaxed);
}

}  // namespace dmagather::server::engines::gpu::cuda

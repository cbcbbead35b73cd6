#include "tests/fakes/lock_graph.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dmagather::server::engines::gpu::testing {

uint64_t LockGraph::Me() {
  static std::atomic<uint64_t> next{0};
  thread_local const uint64_t me = ++next;
  return me;
}

LockGraph::ThreadState& LockGraph::Self() {
  auto [it, fresh] = threads_.try_emplace(Me());
  if (fresh) {
    char name[32] = {0};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    it->second.name = absl::StrCat("thread ", ++next_thread_, " (", name, ")");
  }
  return it->second;
}

void LockGraph::SetRole(const std::string& role) {
  std::lock_guard<std::mutex> lock(mu_);
  ThreadState& t = Self();
  if (t.name.rfind("thread ", 0) == 0) t.name = absl::StrCat(role, " [", t.name, "]");
}

std::string LockGraph::ThreadName() {
  std::lock_guard<std::mutex> lock(mu_);
  return Self().name;
}

void LockGraph::AddEdges(ThreadState& t, const std::string& lock, const std::string& what) {
  for (const std::string& h : t.held) {
    if (h == lock) continue;
    std::set<std::string> gates;
    for (const std::string& g : t.held) {
      if (g != h) gates.insert(g);
    }
    Edge& e = edges_[{h, lock}];
    bool changed = e.by_thread.emplace(Me(), what).second;
    if (!e.gates_set) {
      e.gates = std::move(gates);
      e.gates_set = changed = true;
    } else {
      std::set<std::string> both;
      std::set_intersection(e.gates.begin(), e.gates.end(), gates.begin(), gates.end(),
                            std::inserter(both, both.begin()));
      if (both.size() != e.gates.size()) {
        e.gates = std::move(both);
        changed = true;
      }
    }
    if (changed) CheckCycles(h, lock);
  }
}

// Every simple path of at most 4 edges from `to` back to `from` closes a
// cycle with the edge from -> to; one is reported when two threads can
// make its edges and no lock is held around all of them.
void LockGraph::CheckCycles(const std::string& from, const std::string& to) {
  std::vector<std::string> path{from, to};
  std::function<void()> walk = [&] {
    const std::string at = path.back();  // A copy: the walk grows `path`.
    if (at == from) {
      std::vector<const Edge*> es;
      for (size_t i = 0; i + 1 < path.size(); ++i) es.push_back(&edges_.at({path[i], path[i + 1]}));
      // A deadlock needs every edge in progress at once, each in its own
      // thread: two edges made under one common lock never are.
      std::set<uint64_t> threads;
      for (const Edge* e : es) {
        for (const auto& [id, call] : e->by_thread) threads.insert(id);
      }
      for (size_t i = 0; i < es.size(); ++i) {
        for (size_t j = i + 1; j < es.size(); ++j) {
          for (const std::string& g : es[i]->gates) {
            if (es[j]->gates.count(g)) return;  // Serialised by g.
          }
        }
      }
      if (threads.size() < 2) return;  // One thread cannot wait for itself.
      std::vector<std::string> key(path.begin(), path.end() - 1);
      std::rotate(key.begin(), std::min_element(key.begin(), key.end()), key.end());
      if (!reported_.insert(absl::StrJoin(key, ">")).second) return;
      std::string r = absl::StrCat("lock-order cycle ", absl::StrJoin(path, " -> "), ":");
      // One thread per edge, distinct where possible (edges with fewer
      // threads choose first), so the report shows the threads that invert.
      std::vector<size_t> by_choice(es.size());
      for (size_t i = 0; i < es.size(); ++i) by_choice[i] = i;
      std::stable_sort(by_choice.begin(), by_choice.end(),
                       [&](size_t a, size_t b) { return es[a]->by_thread.size() < es[b]->by_thread.size(); });
      std::set<uint64_t> used;
      std::vector<std::map<uint64_t, std::string>::const_iterator> pick(es.size());
      for (size_t i : by_choice) {
        pick[i] = es[i]->by_thread.begin();
        for (auto it = es[i]->by_thread.begin(); it != es[i]->by_thread.end(); ++it) {
          if (!used.count(it->first)) {
            pick[i] = it;
            break;
          }
        }
        used.insert(pick[i]->first);
      }
      for (size_t i = 0; i < es.size(); ++i) {
        absl::StrAppend(&r, i ? ";" : "", " [", threads_.at(pick[i]->first).name, "] took ", path[i + 1],
                        " while holding ", path[i], " (", pick[i]->second, ")");
      }
      if (cycles_.size() < 32) cycles_.push_back(std::move(r));  // Enough to read; more say nothing new.
      return;
    }
    if (path.size() > 5) return;
    for (auto it = edges_.lower_bound({at, ""}); it != edges_.end() && it->first.first == at; ++it) {
      const std::string& next = it->first.second;
      if (next != from && std::find(path.begin() + 1, path.end(), next) != path.end()) continue;
      path.push_back(next);
      walk();
      path.pop_back();
    }
  };
  walk();
}

bool LockGraph::Acquire(const std::string& lock, const std::string& what) {
  std::unique_lock<std::mutex> l(mu_);
  ThreadState& t = Self();
  if (aborted_) return false;
  AddEdges(t, lock, what);
  const uint64_t me = Me();
  auto free = [&] { return aborted_ || !holder_.count(lock) || holder_[lock] == me; };
  if (!free()) {
    t.waits_for = lock;
    t.call = what;
    cv_.wait(l, free);
    t.waits_for.clear();
    t.call.clear();
  }
  if (aborted_) return false;
  holder_[lock] = me;
  t.held.push_back(lock);
  return true;
}

void LockGraph::Release(const std::string& lock) {
  {
    std::lock_guard<std::mutex> l(mu_);
    ThreadState& t = Self();
    auto it = std::find(t.held.rbegin(), t.held.rend(), lock);
    if (it != t.held.rend()) t.held.erase(std::next(it).base());
    auto h = holder_.find(lock);
    if (h != holder_.end() && h->second == Me() && std::find(t.held.begin(), t.held.end(), lock) == t.held.end()) {
      holder_.erase(h);
    }
  }
  cv_.notify_all();
}

void LockGraph::Held(const std::string& lock, const std::string& what) {
  std::lock_guard<std::mutex> l(mu_);
  ThreadState& t = Self();
  AddEdges(t, lock, what);
  t.held.push_back(lock);
}

void LockGraph::Blocking(const std::string& on) {
  std::lock_guard<std::mutex> l(mu_);
  Self().waits_for = on;
}

void LockGraph::Unblocked() {
  std::lock_guard<std::mutex> l(mu_);
  Self().waits_for.clear();
}

std::vector<std::string> LockGraph::cycles() const {
  std::lock_guard<std::mutex> l(mu_);
  return cycles_;
}

std::vector<LockGraph::Waiter> LockGraph::waiters() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<Waiter> out;
  for (const auto& [id, t] : threads_) {
    if (t.waits_for.empty()) continue;
    Waiter w{t.name, t.waits_for, "", t.held};
    auto h = holder_.find(t.waits_for);
    if (h != holder_.end()) w.holder = threads_.at(h->second).name;
    out.push_back(std::move(w));
  }
  return out;
}

std::string LockGraph::Dump() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string d;
  for (const auto& [id, t] : threads_) {
    if (t.held.empty() && t.waits_for.empty()) continue;
    absl::StrAppend(&d, "  ", t.name, ": holds [", absl::StrJoin(t.held, ", "), "]");
    if (!t.waits_for.empty()) absl::StrAppend(&d, ", waits for ", t.waits_for, t.call.empty() ? "" : " in ", t.call);
    absl::StrAppend(&d, "\n");
  }
  return d;
}

void LockGraph::Abort() {
  {
    std::lock_guard<std::mutex> l(mu_);
    aborted_ = true;
  }
  cv_.notify_all();
}

bool LockGraph::aborted() const {
  std::lock_guard<std::mutex> l(mu_);
  return aborted_;
}

}  // namespace dmagather::server::engines::gpu::testing

#include "server/service/reaper.h"

#include <malloc.h>

namespace dmagather::server::service {

void DeferredFrees::Retire(uint64_t epoch, std::shared_ptr<Retirable> item) {
  if (item == nullptr || item->memory_released()) return;
  absl::MutexLock lock(&mu_);
  for (const auto& [e, queued] : queue_) {
    if (queued == item) return;
  }
  queue_.emplace_back(epoch, std::move(item));
}

std::vector<std::shared_ptr<Retirable>> DeferredFrees::TakeDue(uint64_t epoch, bool gated) {
  std::vector<std::shared_ptr<Retirable>> due;
  absl::MutexLock lock(&mu_);
  while (!queue_.empty() && (!gated || epoch >= queue_.front().first + 2)) {
    due.push_back(std::move(queue_.front().second));
    queue_.pop_front();
  }
  return due;
}

size_t DeferredFrees::size() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

HeapTrimmer::HeapTrimmer(common::Clock* clock) : HeapTrimmer(clock, [] { malloc_trim(0); }) {}

bool HeapTrimmer::AfterPass(int freed) {
  // Sessions that ended leave freed heap behind (their gRPC streams and
  // connections, protobufs, sessions); glibc keeps it in its arenas unless
  // asked.
  freed_since_trim_ += freed;
  if (freed_since_trim_ <= 0) return false;
  const absl::Time now = clock_->Now();
  if (trimmed_ && now - last_trim_ < every_) return false;
  trim_();
  trimmed_ = true;
  last_trim_ = now;
  freed_since_trim_ = 0;
  return true;
}

void ReaperThread::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void ReaperThread::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
  cv_.Signal();
}

void ReaperThread::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void ReaperThread::Loop() {
  bool idle = false;
  for (;;) {
    {
      // Every 20 ms while there are jobs or frees waiting; an idle daemon
      // wakes once a second (or at Wake()). The predicate is read here, after
      // the wait re-acquired mu_ (not in an absl::Condition: see
      // third_party/system/absl_tsan.cc). The pause is real time (the
      // passes' cadence); what a pass frees, and when the heap is trimmed,
      // is decided on the clock (HeapTrimmer, the ingress epoch).
      absl::MutexLock lock(&mu_);
      const absl::Duration pause = idle ? absl::Seconds(1) : absl::Milliseconds(20);
      while (!stop_ && !wake_) {
        if (cv_.WaitWithTimeout(&mu_, pause)) break;  // Timed out.
      }
      if (stop_) return;
      wake_ = false;
    }
    idle = pass_();
  }
}

}  // namespace dmagather::server::service

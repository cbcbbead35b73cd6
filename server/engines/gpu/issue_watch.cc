#include "server/engines/gpu/issue_watch.h"

#include <glog/logging.h>
#include <pthread.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace dmagather::server::engines::gpu {

IssueWatch::IssueWatch(int devices, common::Clock& clock, WordsOf words, uint64_t limit_ns)
    : clock_(clock), words_(words), limit_ns_(limit_ns), slots_(new Slot[devices]), devices_(devices) {}

IssueWatch::~IssueWatch() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void IssueWatch::StartThread() {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "dmag-watch");
    while (!stop_.load()) {
      absl::SleepFor(absl::Milliseconds(200));  // The pace of the watch, not a decision on time.
      const std::string report = Check();
      if (!report.empty()) LOG(WARNING) << report;
    }
  });
}

std::string IssueWatch::Check() {
  absl::MutexLock lock(&mu_);
  const uint64_t now = clock_.NowNs();
  int stuck = -1;
  for (int d = 0; d < devices_ && stuck < 0; ++d) {
    Slot& s = slots_[d];
    const uint64_t since = s.since_ns.load(std::memory_order_acquire);
    if (since != 0 && now - since > limit_ns_ && s.reported_since != since) {
      s.reported_since = since;
      stuck = d;
    }
  }
  if (stuck < 0) return "";
  reports_.fetch_add(1, std::memory_order_relaxed);
  std::string out = absl::StrCat("issue watch: device ", stuck, "'s issuer has been in one driver call for over ",
                                 limit_ns_ / 1'000'000, " ms; every issuer:");
  for (int d = 0; d < devices_; ++d) {
    const Slot& s = slots_[d];
    const uint64_t since = s.since_ns.load(std::memory_order_acquire);
    const EngineOp* op = s.op.load(std::memory_order_relaxed);
    if (since == 0 || op == nullptr) {
      absl::StrAppend(&out, "\n  device ", d, ": not in a call");
      continue;
    }
    absl::StrAppend(&out, "\n  device ", d, ": ", s.what.load(std::memory_order_relaxed), " of op ", op->seq, " (job ",
                    op->job_id, ") for ", (now - since) / 1'000'000, " ms; ranks' ready/done:");
    for (size_t r = 0; r < op->ranks.size(); ++r) {
      const Words w = op->ranks[r] != nullptr ? words_(op->ranks[r]) : Words{};
      auto word = [](const uint32_t* p) {
        return p == nullptr ? std::string("?") : absl::StrCat(__atomic_load_n(p, __ATOMIC_ACQUIRE));
      };
      absl::StrAppend(&out, " r", r, "=", word(w.ready), "/", word(w.done));
    }
  }
  return out;
}

}  // namespace dmagather::server::engines::gpu

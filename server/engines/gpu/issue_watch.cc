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
  const uint64_t now = clock_.NowNs();
  int stuck = -1;
  for (int d = 0; d < devices_ && stuck < 0; ++d) {
    Slot& s = slots_[d];
    absl::MutexLock slot(&s.mu);
    // A call begun after `now` was read is not over anything.
    if (s.since_ns != 0 && now > s.since_ns && now - s.since_ns > limit_ns_ && s.reported_since != s.since_ns) {
      s.reported_since = s.since_ns;
      stuck = d;
    }
  }
  if (stuck < 0) return "";
  reports_.fetch_add(1, std::memory_order_relaxed);
  std::string out = absl::StrCat("issue watch: device ", stuck, "'s issuer has been in one driver call for over ",
                                 limit_ns_ / 1'000'000, " ms; every issuer:");
  for (int d = 0; d < devices_; ++d) {
    Slot& s = slots_[d];
    absl::MutexLock slot(&s.mu);  // The op stays alive until this device's End.
    if (s.since_ns == 0 || s.op == nullptr) {
      absl::StrAppend(&out, "\n  device ", d, ": not in a call");
      continue;
    }
    const EngineOp* op = s.op;
    absl::StrAppend(&out, "\n  device ", d, ": ", s.what, " of op ", op->seq, " (job ", op->job_id, ") for ",
                    now > s.since_ns ? (now - s.since_ns) / 1'000'000 : 0, " ms; ranks' ready/done:");
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

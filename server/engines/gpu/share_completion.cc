// ShareCompletion: see share_completion.h.
#include "server/engines/gpu/share_completion.h"

#include <pthread.h>
#include <sys/prctl.h>

#include <string>
#include <vector>

#include "server/engines/gpu/backoff.h"
#include "server/engines/gpu/share_poll.h"

namespace dmagather::server::engines::gpu {

ShareCompletion::ShareCompletion(int device, GpuRuntime& runtime, EndEvents& events, InFlightPool& ops,
                                 common::Clock& clock, uint64_t awake_ns, const std::atomic<bool>& abandon)
    : device_(device),
      runtime_(runtime),
      events_(events),
      ops_(ops),
      clock_(clock),
      abandon_(abandon),
      shares_(kSlots, clock, awake_ns) {}

ShareCompletion::~ShareCompletion() { Stop(); }

void ShareCompletion::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void ShareCompletion::Stop() {
  shares_.Stop();
  if (thread_.joinable()) thread_.join();
}

void ShareCompletion::Loop() {
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // 1 us: short sleeps stay short.
  pthread_setname_np(pthread_self(), ("dmag-done-" + std::to_string(device_)).c_str());  // In stacks of a hang.
  runtime_.BindThread(device_);
  // The shares taken in hand and not seen ended yet, polled each on its
  // own (a share parked on its job's ready flags must not hold up another
  // job's), ended in the order of their lane (share_poll.h; docs/CUDA.md,
  // "Locks and waits" and "Completion").
  std::vector<Share> pending;
  pending.reserve(64);
  std::vector<const void*> held;
  const auto query = [this](const Share& sh) -> absl::StatusOr<bool> {
    absl::StatusOr<bool> done = runtime_.QueryEvent(sh.end);
    if (done.ok() && !*done && abandon_.load(std::memory_order_relaxed)) {
      return absl::UnavailableError("dmagatherd stopped while the op's copies were still queued");
    }
    return done;
  };
  const auto end = [&](const Share& sh, const absl::Status& st) {
    events_.Give(sh.end);
    sh.lane->open.fetch_sub(1, std::memory_order_acq_rel);  // The last touch of the lane.
    ops_.Close(sh.op, st);
    shares_.Done();
  };
  uint64_t t0 = 0;
  for (;;) {
    // Ops come in bursts: with nothing in hand, wait (a while polling, so
    // that the issuer need not wake this thread, then asleep).
    if (pending.empty() && !shares_.Wait()) return;  // Stopped with nothing left.
    shares_.Take(&pending, kSlots);
    const bool progress = EndSharesInLaneOrder(pending, held, query, end) > 0;
    if (pending.empty() || progress) {
      t0 = 0;
    } else {
      if (t0 == 0) t0 = clock_.NowNs();
      Backoff(clock_.NowNs() - t0);
    }
  }
}

}  // namespace dmagather::server::engines::gpu

#include "server/scheduler/rank.h"

#include "abi/ring_v1.h"

namespace dmagather::server::scheduler {

Rank::Rank(int rank, int pid, uid_t uid, abi::CompletionV1* completion, std::unique_ptr<engines::EngineRank> engine)
    : rank_(rank), pid_(pid), uid_(uid), completion_(completion), engine_(std::move(engine)) {
  finished.assign(abi::kRingSlotsV1, 0);
}

const char* Rank::state_name() const {
  switch (state()) {
    case State::kJoining:
      return "joining";
    case State::kActive:
      return "active";
    case State::kLeft:
      return "left";
    case State::kGone:
      return "failed";
  }
  return "unknown";
}

void Rank::ReleaseReadyWaiters() {
  if (released()) return;
  abi::CompletionV1* c = completion_;
  abi::StoreSeqCst(&c->ready_seq, abi::LoadAcquire(&c->done_seq) + abi::kRingSlotsV1 + 1);
}

void Rank::Release() {
  if (released_.exchange(true)) return;
  engine_.reset();
  completion_ = nullptr;
}

}  // namespace dmagather::server::scheduler

#include "server/scheduler/completion_writer.h"

#include <algorithm>
#include <cstring>

#include "common/futex.h"

namespace dmagather::server::scheduler {

void RecordError(abi::CompletionV1* c, uint32_t seq, int32_t api_status, int32_t failed_rank,
                 absl::string_view message) {
  uint32_t n = c->error_count;  // Only the daemon writes error_count.
  abi::ErrorRecordV1& rec = c->errors[n % abi::kErrorSlotsV1];
  rec.stamp = abi::kErrorRecordStampV1;
  rec.seq = seq;
  rec.status = api_status;
  rec.failed_rank = failed_rank;
  size_t len = std::min(message.size(), sizeof(rec.message) - 1);
  std::memcpy(rec.message, message.data(), len);
  rec.message[len] = '\0';
  abi::StoreRelease(&c->error_count, n + 1);
}

void PublishDone(abi::CompletionV1* c, uint32_t seq) {
  abi::StoreSeqCst(&c->done_seq, seq);
  if (abi::LoadSeqCst(&c->done_waiters) != 0) common::FutexWakeAll(&c->done_seq);
}

}  // namespace dmagather::server::scheduler

#include "client/op_table.h"

#include <cstring>

#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "common/api_names.h"
#include "common/status.h"
#include "dmagather/dmagather.h"

namespace dmagather::client {
namespace {

constexpr uint32_t kFatalMask =
    (1u << DMAGATHER_UNAVAILABLE) | (1u << DMAGATHER_PEER_FAILED) | (1u << DMAGATHER_TIMEOUT);

}  // namespace

OpTable::OpTable(int rank) : rank_(rank), records_(abi::kRingSlotsV1) {}

std::string OpTable::Prefix() const { return absl::StrCat("rank ", rank_, ": "); }

absl::StatusOr<uint32_t> OpTable::Seq(uint64_t op) const {
  if (op == 0 || op > submitted_) {
    return absl::InvalidArgumentError(
        absl::StrCat(Prefix(), "op ", op, " was not submitted on this communicator (", submitted_, " ops so far)"));
  }
  if (submitted_ - op >= (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(Prefix(), "op ", op, " is too old to be waited for"));
  }
  return static_cast<uint32_t>(op);
}

void OpTable::Scan() {
  // done_seq first: every record of an op <= done was written before it.
  const uint32_t done = abi::LoadAcquire(&completion_->done_seq);
  const uint32_t n = abi::LoadAcquire(&completion_->error_count);
  const uint32_t prev_done = scanned_done_;
  scanned_done_ = done;
  if (n == errors_scanned_) return;
  uint32_t first = errors_scanned_;
  if (n - first > abi::kErrorSlotsV1) {
    // Records were overwritten before this rank read them: ops finished
    // since the last scan may have lost their status.
    lost_from_ = prev_done;
    lost_upto_ = done;
    first = n - abi::kErrorSlotsV1;
  }
  for (uint32_t i = first; i != n; ++i) {
    const abi::ErrorRecordV1& rec = completion_->errors[i % abi::kErrorSlotsV1];
    Record& o = records_[rec.seq % records_.size()];
    o.reported = false;
    o.seq = rec.seq;
    o.status = rec.status;
    o.message.assign(rec.message, strnlen(rec.message, sizeof(rec.message)));
  }
  errors_scanned_ = n;
}

absl::Status OpTable::Status(uint32_t seq) {
  Scan();
  Record& o = records_[seq % records_.size()];
  if (o.seq == seq && o.status != 0) {
    o.reported = true;  // Returned here: dmagather_wait does not report it again.
    return common::FromApiStatus(o.status, o.message);
  }
  if (lost_upto_ != lost_from_ && abi::SeqGeq(lost_upto_, seq) && !abi::SeqGeq(lost_from_, seq)) {
    return absl::InternalError(
        absl::StrCat(Prefix(), "the status of op ", seq, " was lost (more than 16 ops failed before it was read)"));
  }
  return absl::OkStatus();
}

absl::Status OpTable::CollectErrors() {
  Scan();
  const uint32_t n = abi::LoadAcquire(&completion_->error_count);
  if (n == errors_seen_) return absl::OkStatus();
  uint32_t first = errors_seen_;
  if (n - first > abi::kErrorSlotsV1) first = n - abi::kErrorSlotsV1;
  // The first failure since the last wait that op_wait/op_test has not
  // already returned; the others are counted in the message.
  const abi::ErrorRecordV1* rec = nullptr;
  uint32_t unreported = n - errors_seen_ - (n - first);  // Records lost to overflow count as unreported.
  for (uint32_t i = first; i != n; ++i) {
    const abi::ErrorRecordV1& r = completion_->errors[i % abi::kErrorSlotsV1];
    const Record& o = records_[r.seq % records_.size()];
    if (o.seq == r.seq && o.reported) continue;
    ++unreported;
    if (rec == nullptr) rec = &r;
  }
  errors_seen_ = n;
  if (rec == nullptr) return absl::OkStatus();
  std::string msg(rec->message, strnlen(rec->message, sizeof(rec->message)));
  if (unreported > 1) {
    absl::StrAppend(&msg, " (and ", unreported - 1, " more failed operation(s) since the last wait)");
  }
  return common::FromApiStatus(rec->status, msg);
}

bool OpTable::FatalPending() const {
  const uint32_t n = abi::LoadAcquire(&completion_->error_count);
  for (uint32_t i = errors_seen_; i != n; ++i) {
    if (n - i > abi::kErrorSlotsV1) continue;
    if (kFatalMask & (1u << completion_->errors[i % abi::kErrorSlotsV1].status)) return true;
  }
  return false;
}

}  // namespace dmagather::client

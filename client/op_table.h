// OpTable: one rank's ops as its completion block reports them. It hands
// out the op handles (a handle is the count of ops submitted so far; its low
// 32 bits are the op's sequence number), reads the error records the daemon
// writes into a table by sequence number, remembers which op_wait/op_test
// already returned (so dmagather_wait does not report them again), and
// which ops may have lost their record (more failures than the block holds
// arrived between two reads).
//
// Threads: the communicator's user thread only (one call at a time); the
// completion block is read with acquire loads (the daemon writes it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "abi/completion_v1.h"
#include "absl/status/statusor.h"

namespace dmagather::client {

class OpTable {
 public:
  // `rank` only names the rank in messages.
  explicit OpTable(int rank);

  // The rank's completion block (set once, at Join, before any op).
  void Attach(const abi::CompletionV1* completion) { completion_ = completion; }

  // Ops submitted so far: also the handle of the last one.
  uint64_t submitted() const { return submitted_; }
  // The sequence number the next op takes.
  uint32_t next_seq() const { return static_cast<uint32_t>(submitted_ + 1); }
  // The next op was published: its handle is submitted().
  void CountSubmitted() { ++submitted_; }

  // Checks that `op` names a submitted op that can still be waited for;
  // its 32-bit sequence number.
  absl::StatusOr<uint32_t> Seq(uint64_t op) const;
  // The status of finished op `seq` (its error record, if any); marks it
  // reported.
  absl::Status Status(uint32_t seq);
  // The first failure since the last call that Status() has not already
  // returned, counting the others in the message.
  absl::Status CollectErrors();
  // Whether a failure not yet collected ends the job (peer failed, timeout,
  // daemon stopping): then every later call reports it at once.
  bool FatalPending() const;

 private:
  // The status of one finished op, from its error record.
  struct Record {
    uint32_t seq = 0;
    int32_t status = 0;
    std::string message;
    bool reported = false;  // Status() returned it (CollectErrors skips it).
  };
  // Reads new error records into records_.
  void Scan();
  std::string Prefix() const;

  const int rank_;
  const abi::CompletionV1* completion_ = nullptr;
  uint64_t submitted_ = 0;
  uint32_t errors_seen_ = 0;  // Error records returned by CollectErrors.
  uint32_t errors_scanned_ = 0;
  uint32_t scanned_done_ = 0;  // done_seq at the last Scan.
  // Ops in (lost_from_, lost_upto_] may have lost their error record.
  uint32_t lost_from_ = 0;
  uint32_t lost_upto_ = 0;
  std::vector<Record> records_;  // By seq % ring slots.
};

}  // namespace dmagather::client

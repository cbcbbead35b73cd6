// Session: one rank of one job, from Join to the end of its Join stream, as
// the control service holds it. Its uid and pid are the kernel's (SO_PEERCRED
// of the fd-channel hand-over of its segment). Owns the mapping of the rank's segment
// (request ring + completion block) and ties together the two views of it
// that the data path uses: the ingress side's RankInput (ring, regions) and
// the scheduler's Rank (completion, counters, engine context).
//
// Threads: created on a gRPC thread (Join); Leave/Register/Deregister on
// gRPC threads; ReleaseMemory on the reaper thread once nothing can touch
// the segment any more.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/memfd.h"
#include "server/engines/copy_engine.h"
#include "server/ingress/rank_input.h"
#include "server/scheduler/rank.h"
#include "server/service/reaper.h"
#include "server/service/requests.h"
#include "server/service/ticket_table.h"

namespace dmagather::server::service {

class Session final : public Retirable {
 public:
  // Maps the segment the client handed over (`segment`, claimed from the
  // ticket in `req`), checks its header and token, attaches the rank to
  // `engine`. No registry lock is held while this runs.
  static absl::StatusOr<std::shared_ptr<Session>> Open(uint64_t id, const JoinSpec& req, const Handover& segment,
                                                       engines::CopyEngine* engine);
  ~Session() override;

  uint64_t id() const { return id_; }
  uid_t uid() const { return uid_; }
  pid_t pid() const { return pid_; }
  int rank_index() const { return rank_->rank(); }
  const std::string& secret() const { return secret_; }
  // Constant-time comparison with a secret a caller presented.
  bool SecretMatches(const std::string& presented) const;
  uint32_t abi_version() const { return abi_version_; }
  const engines::DeviceRef& device() const { return device_; }

  const std::shared_ptr<scheduler::Rank>& rank() const { return rank_; }
  const std::shared_ptr<ingress::RankInput>& input() const { return input_; }

  // The Join stream ended and the job was told (set by EndSession last).
  std::atomic<bool> ended{false};
  // Joined to take its job back from an earlier daemon; `resumed` once it
  // called Resume (under the registry's lock).
  bool resume() const { return resume_; }
  std::atomic<bool> resumed{false};

  // The segment memfd's identity (fstat at Open): it can never be
  // registered as a data buffer.
  dev_t segment_dev() const { return segment_dev_; }
  ino_t segment_ino() const { return segment_ino_; }

  // Registration bookkeeping (RegistryCore::Register/Deregister, one at a time
  // per session under register_mu): host buffers by (st_dev, st_ino, bytes),
  // so the same memfd registered again is the same region, not a second
  // mapping; and what each region charged to the uid's mapped bytes.
  struct HostKey {
    dev_t dev;
    ino_t ino;
    uint64_t bytes;
    bool operator<(const HostKey& o) const { return std::tie(dev, ino, bytes) < std::tie(o.dev, o.ino, o.bytes); }
  };
  struct Registered {
    bool host = false;
    HostKey key{};
    uint64_t host_bytes = 0;
  };
  absl::Mutex register_mu;
  std::map<HostKey, uint32_t> by_inode ABSL_GUARDED_BY(register_mu);
  std::map<uint32_t, Registered> registered ABSL_GUARDED_BY(register_mu);
  // Undoes the engine's attach, drops the regions, unmaps the segment.
  // Safe to call more than once.
  void ReleaseMemory() override;
  bool memory_released() const override { return released_.load(std::memory_order_acquire); }

 private:
  Session(uint64_t id, std::string secret, uid_t uid, pid_t pid, common::MemfdMapping segment);

  const uint64_t id_;
  const std::string secret_;
  const uid_t uid_;
  const pid_t pid_;
  dev_t segment_dev_ = 0;
  ino_t segment_ino_ = 0;
  uint32_t abi_version_ = 1;
  engines::DeviceRef device_;
  bool resume_ = false;
  common::MemfdMapping segment_;
  std::shared_ptr<scheduler::Rank> rank_;
  std::shared_ptr<ingress::RankInput> input_;
  std::atomic<bool> released_{false};
};

}  // namespace dmagather::server::service

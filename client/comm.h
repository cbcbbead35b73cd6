// CommImpl: one rank's connection to dmagatherd. Join and registration go
// over gRPC; every AllGather is a descriptor in the rank's shared-memory
// ring (no system call, no allocation), completed through the done flag.
// A watcher thread holds the Join stream: when it ends, the daemon is gone.
//
// Threads: one user thread at a time calls the public methods; the watcher
// thread only sets daemon_gone_.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "abi/ring_v1.h"
#include "client/cuda_client.h"
#include "dmagather/v1/control.grpc.pb.h"
#include "dmagather/dmagather.h"
#include "common/shm.h"

namespace dmagather::client {

struct CommOptions {
  std::string socket_path;  // Empty: $DMAGATHER_SOCKET, then the default.
  std::string job_key;
  int world_size = 0;
  int rank = 0;
  int join_timeout_ms = 60000;
};

class CommImpl {
 public:
  static absl::StatusOr<std::unique_ptr<CommImpl>> Create(const CommOptions& options);
  ~CommImpl();

  absl::StatusOr<void*> Alloc(size_t bytes);
  absl::Status Free(void* ptr);
  absl::Status Register(void* ptr, size_t bytes);
  absl::Status Deregister(void* ptr);

  absl::Status AllGather(const void* send, void* recv, size_t count, dmagather_dtype_t dtype, void* stream);
  absl::Status AllGatherList(const void* send, void* const* recvs, size_t count, dmagather_dtype_t dtype,
                             void* stream);
  absl::Status Wait();
  // Leaves the job (after waiting for outstanding ops).
  absl::Status Close();

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const std::string& backend() const { return backend_; }
  const std::string& daemon_version() const { return daemon_version_; }
  uint32_t submitted() const { return submitted_seq_; }

  // Publishes a hand-made descriptor through the normal ring path (its seq
  // is set to the next one). For tests of the daemon's validation.
  absl::Status SubmitRawForTesting(const abi::DescriptorV1& d);

 private:
  struct Region {
    uint64_t bytes = 0;
    uint32_t id = 0;
    common::ShmMapping mapping;  // Set when the library allocated it.
    // cuda: the allocation's buffer id (changes when the address range is
    // freed and reused) and whether dmagather_alloc made it.
    uint64_t buffer_id = 0;
    bool device_owned = false;
  };

  explicit CommImpl(const CommOptions& options);
  absl::Status Join();
  absl::StatusOr<abi::BufferRefV1> Resolve(const void* ptr, uint64_t bytes, const char* what) const;
  absl::Status CheckHealthy();  // Daemon alive, no pending error records.
  // cpu_ready: also move ready_seq from the CPU (host backend); on cuda the
  // caller's stream writes it.
  // The common submit path of AllGather (recvs = &recv) and AllGatherList.
  absl::Status Submit(uint32_t op, const void* send, void* const* recvs, size_t count, dmagather_dtype_t dtype,
                      void* stream);
  // The Deregister RPC for one region id.
  absl::Status DeregisterRegion(uint32_t region_id);
  absl::Status Publish(abi::DescriptorV1* d, bool cpu_ready = true);
  // --- cuda backend ---
  // Registers the device allocation containing [ptr, ptr+bytes) (its base,
  // once; again when the range was freed and reused).
  absl::Status RegisterDevice(const void* ptr, uint64_t bytes);
  // Resolve() that registers unknown or reused device memory on the way.
  absl::StatusOr<abi::BufferRefV1> ResolveDevice(const void* ptr, uint64_t bytes, const char* what);
  absl::Status SubmitCuda(uint32_t opcode, const void* send, void* const* recvs, size_t count,
                          dmagather_dtype_t dtype, void* stream);
  // Blocks until done_seq >= seq (cyclically) or the daemon is gone.
  absl::Status WaitDone(uint32_t seq);
  absl::Status CollectErrors();
  absl::Status DaemonGone() const;

  const CommOptions options_;
  std::string backend_;
  std::string daemon_version_;
  uint64_t session_id_ = 0;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Control::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> join_ctx_;
  std::unique_ptr<grpc::ClientReader<v1::JoinEvent>> join_stream_;
  std::thread watcher_;
  std::atomic<bool> daemon_gone_{false};
  mutable absl::Mutex gone_mu_;
  std::string gone_reason_;

  common::ShmMapping segment_;
  abi::SegmentViewV1 view_;
  common::ShmMapping doorbell_;
  abi::DoorbellV1* bell_ = nullptr;

  uint32_t spin_ = 256;
  uint32_t submitted_seq_ = 0;
  uint32_t errors_seen_ = 0;
  bool closed_ = false;
  std::map<uintptr_t, Region> regions_;  // By client base address.

  // cuda backend (null on host). Declared last: released before the segment.
  std::unique_ptr<CudaClient> cuda_;
  uint32_t released_done_ = 0;  // done_seq when the daemon went away (cuda).
};

}  // namespace dmagather::client

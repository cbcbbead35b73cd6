// ControlChannel: one rank's control plane to dmagatherd: the gRPC channel
// and stub, the Join stream (held for the session's life by a watcher
// thread: when it ends, the daemon is gone or ended the session), Leave,
// Register and Deregister, and the fd-channel hand-overs of the memory a
// Register names. The only client piece that reads or writes a protobuf.
//
// Threads: the communicator's user thread calls every method (one at a
// time); the watcher thread only reads the stream and, when it ends, calls
// the on_end callback once. EndStream() joins it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "client/backend.h"
#include "common/clock.h"
#include "common/fd_exchange.h"
#include "dmagather/v1/control.grpc.pb.h"

namespace dmagather::client {

// gRPC status -> absl::Status ("what: message"; FALLBACK kept).
absl::Status FromGrpc(const grpc::Status& s, absl::string_view what);

// The socket to use: `explicit_path`, else $DMAGATHER_SOCKET, else the default.
std::string ResolveSocket(const std::string& explicit_path);

// A new multi-node job id from the daemon at `socket_path` ("" = default).
absl::StatusOr<std::string> CreateJobId(const std::string& socket_path);

struct JoinParams {
  std::string job_key;
  int world_size = 0;
  int rank = 0;
  std::string segment_ticket;  // The segment's hand-over.
  uint64_t segment_token = 0;  // Also in the segment's header.
  int join_timeout_ms = 60000;
  ProbedDevice device;
  std::string job_id;
  bool resume = false;           // Taking the job back from an earlier daemon (control.proto).
  int reconnect_s = 0;           // DMAGATHER_RECONNECT_S, told to the daemon.
  std::vector<int> local_ranks;  // resume with a job id: the job's ranks on this node.
};

struct JoinAnswer {
  uint64_t session_id = 0;
  std::string session_secret;
  std::string backend;  // "host" when the daemon named none.
  std::string daemon_version;
  std::optional<uint32_t> wait_spin;  // The daemon's advice.
  bool resumed = false;               // The daemon took the job back (asked with JoinParams::resume).
  bool takes_captured = false;        // ... and takes back ops captured into CUDA graphs.
  bool takes_alltoall = false;        // The daemon serves all-to-all ops and reduce-scatters.
  std::vector<int> local_ranks;       // The job's ranks on the daemon's node.
};

class ControlChannel {
 public:
  // Connects to the daemon at `socket_path` (within `timeout_ms`), saying so
  // when this user may not (permissions) or nobody answers (a stale socket).
  // `clock` decides when a Join's answer is given up on.
  static absl::StatusOr<std::unique_ptr<ControlChannel>> Connect(const std::string& socket_path,
                                                                 const common::Clock& clock = common::RealClock(),
                                                                 int timeout_ms = 1000);
  ~ControlChannel();

  const std::string& socket_path() const { return socket_path_; }

  // Hands the rank's segment over on the fd channel: its ticket and the
  // daemon's doorbell descriptor. `require_uid` >= 0: only to a daemon of
  // that uid (a rank coming back hands its segment to no one else).
  absl::StatusOr<common::FdExchangeResult> HandOverSegment(int fd, uint64_t bytes, int rank, int64_t require_uid = -1);

  // Sends the Join and waits for its answer (all ranks in, or an error);
  // a daemon that does not answer within the join timeout plus 10 s is
  // given up on (DEADLINE_EXCEEDED).
  absl::StatusOr<JoinAnswer> Join(const JoinParams& p);
  // Whether a Join stream is open.
  bool joined() const { return stream_ != nullptr; }
  // Starts the watcher: it holds the stream until it ends, then calls
  // `on_end` (on its thread) with why, and whether a daemon may take the
  // job back (the connection was lost, or the daemon stopped; not when the
  // daemon ended this session).
  void StartWatcher(std::function<void(const std::string& reason, bool resumable, int code)> on_end);
  // Leaves the session (best effort, 2 s).
  void Leave();
  // Cancels the Join stream, joins the watcher, finishes the call.
  void EndStream();

  // Registers `e` (handing its memory over first where it is descriptors);
  // the daemon's region id. `owned` (may be null: memory the caller
  // allocated) hears when the daemon has answered. `rank` names the rank
  // in messages.
  // `region_id` (a resumed session, before Resume): the id the region had.
  absl::StatusOr<uint32_t> Register(const MemoryExport& e, int rank, OwnedBuffer* owned, uint32_t region_id = 0);
  absl::Status Deregister(uint32_t region_id);
  // A resumed session registered again what it had (control.proto Resume),
  // with its ops captured into live CUDA graphs.
  absl::Status Resume(uint64_t gap_us, uint32_t ops_pending, const std::vector<CapturedDefinition>& captured);

 private:
  ControlChannel(std::string socket_path, std::shared_ptr<grpc::Channel> channel, const common::Clock& clock);
  // Waits for the first event of the stream (the Join's answer).
  absl::StatusOr<JoinAnswer> ReadAnswer(const JoinParams& p);
  // The fd-channel tickets of `e`'s memory, put into `req`.
  absl::Status HandOverExport(const MemoryExport& e, int rank, v1::RegisterRequest* req);

  const std::string socket_path_;
  const common::Clock* const clock_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Control::Stub> stub_;
  uint64_t session_id_ = 0;
  std::string session_secret_;
  std::unique_ptr<grpc::ClientContext> join_ctx_;
  std::unique_ptr<grpc::ClientReader<v1::JoinEvent>> stream_;
  std::thread watcher_;
};

}  // namespace dmagather::client

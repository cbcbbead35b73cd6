#include "client/control_channel.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "abi/device_memory_v1.h"
#include "abi/fd_channel_v1.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "dmagather/dmagather.h"

namespace dmagather::client {
namespace {

// Binary error details by which the daemon marks a FAILED_PRECONDITION as FALLBACK.
constexpr char kGrpcFallbackDetails[] = "dmagather.fallback";

std::chrono::system_clock::time_point In(int ms) { return common::GrpcDeadlineIn(absl::Milliseconds(ms)); }

v1::JoinRequest JoinRequestOf(const JoinParams& p) {
  v1::JoinRequest req;
  req.set_job_key(p.job_key);
  req.set_world_size(p.world_size);
  req.set_rank(p.rank);
  req.set_pid(getpid());
  req.set_segment_ticket(p.segment_ticket);
  req.set_segment_token(p.segment_token);
  req.set_join_timeout_ms(p.join_timeout_ms);
  req.mutable_device()->set_kind(p.device.kind);
  req.mutable_device()->set_ordinal(p.device.ordinal);
  req.mutable_device()->set_uuid(p.device.uuid);
  req.mutable_device()->set_pci_bus_id(p.device.pci_bus_id);
  req.set_abi_version(2);
  req.set_capability_version(1);
  req.set_client_version(DMAGATHER_VERSION_STRING);
  req.set_job_id(p.job_id);
  req.set_resume(p.resume);
  req.set_reconnect_s(uint32_t(std::max(0, p.reconnect_s)));
  for (int r : p.local_ranks) req.add_local_ranks(r);
  return req;
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", s.error_message());
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION && s.error_details() == kGrpcFallbackDetails) {
    return common::FallbackError(msg);
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

std::string ResolveSocket(const std::string& explicit_path) {
  if (!explicit_path.empty()) return explicit_path;
  const char* env = std::getenv("DMAGATHER_SOCKET");
  if (env != nullptr && *env != '\0') return env;
  return DMAGATHER_DEFAULT_SOCKET;
}

absl::StatusOr<std::string> CreateJobId(const std::string& socket_path) {
  const std::string path = ResolveSocket(socket_path);
  if (access(path.c_str(), F_OK) != 0) {
    return absl::UnavailableError(absl::StrCat("no dmagatherd socket at ", path, ": is dmagatherd running?"));
  }
  auto stub = v1::Control::NewStub(grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(10000));
  v1::CreateJobIdRequest req;
  v1::CreateJobIdReply reply;
  grpc::Status st = stub->CreateJobId(&ctx, req, &reply);
  if (!st.ok()) return FromGrpc(st, "create a job id");
  return reply.job_id();
}

ControlChannel::ControlChannel(std::string socket_path, std::shared_ptr<grpc::Channel> channel,
                               const common::Clock& clock)
    : socket_path_(std::move(socket_path)),
      clock_(&clock),
      channel_(std::move(channel)),
      stub_(v1::Control::NewStub(channel_)) {}

ControlChannel::~ControlChannel() { EndStream(); }

absl::StatusOr<std::unique_ptr<ControlChannel>> ControlChannel::Connect(const std::string& socket_path,
                                                                        const common::Clock& clock, int timeout_ms) {
  // Connecting to a Unix socket needs write permission on it: say so,
  // rather than "stale socket", when this user lacks it.
  if (access(socket_path.c_str(), R_OK | W_OK) != 0 && (errno == EACCES || errno == EPERM)) {
    struct stat st;
    const std::string who = stat(socket_path.c_str(), &st) == 0
                                ? absl::StrCat(" (owner uid ", st.st_uid, ", gid ", st.st_gid, ", mode ",
                                               absl::StrFormat("%04o", st.st_mode & 07777), ")")
                                : "";
    return absl::PermissionDeniedError(absl::StrCat(
        "permission denied on ", socket_path, who, ": this user (uid ", getuid(),
        ") may not connect to dmagatherd; the operator sets who may with --socket_mode and the socket's group"));
  }
  // Short reconnect backoffs (gRPC's are 1 s to 120 s): the process's
  // communicators share one connection to the socket (the daemon allows a
  // user a bounded number), and after a daemon restart that connection
  // must try again within the 50 ms at which a rank polls for the new one.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  auto channel = grpc::CreateCustomChannel("unix:" + socket_path, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(In(timeout_ms))) {
    return absl::UnavailableError(absl::StrCat("cannot connect to dmagatherd at ", socket_path, " within ", timeout_ms,
                                               " ms (stale socket of a daemon that is not running?)"));
  }
  return std::unique_ptr<ControlChannel>(new ControlChannel(socket_path, std::move(channel), clock));
}

absl::StatusOr<common::FdExchangeResult> ControlChannel::HandOverSegment(int fd, uint64_t bytes, int rank,
                                                                         int64_t require_uid) {
  auto handed = common::ExchangeFd(common::FdChannelPath(socket_path_), abi::kFdSegment, fd, bytes,
                                   /*timeout_ms=*/5000, require_uid);
  if (!handed.ok()) {
    return common::Annotate(handed.status(),
                            absl::StrCat("rank ", rank, " could not hand its segment to dmagatherd: "));
  }
  return handed;
}

absl::StatusOr<JoinAnswer> ControlChannel::Join(const JoinParams& p) {
  join_ctx_ = std::make_unique<grpc::ClientContext>();
  stream_ = stub_->Join(join_ctx_.get(), JoinRequestOf(p));
  auto answer = ReadAnswer(p);
  if (answer.ok()) {
    session_id_ = answer->session_id;
    session_secret_ = answer->session_secret;
  }
  return answer;
}

absl::StatusOr<JoinAnswer> ControlChannel::ReadAnswer(const JoinParams& p) {
  // The stream lives as long as the session, so it has no deadline; its
  // first event (the reply) must come within the join timeout plus slack,
  // else the call is cancelled: a Join that never reaches the daemon must
  // not hang the rank.
  v1::JoinEvent ev;
  bool got = false;
  bool no_answer = false;
  {
    absl::Mutex mu;
    absl::CondVar cv;
    bool answered = false;  // Under mu (a local: no annotation).
    std::thread watchdog([&] {
      const common::Clock& clock = *clock_;
      const absl::Time deadline = clock.Now() + absl::Milliseconds(int64_t{p.join_timeout_ms} + 10000);
      absl::MutexLock lock(&mu);
      while (!answered && clock.Now() < deadline) cv.WaitWithTimeout(&mu, deadline - clock.Now());
      if (!answered) {
        no_answer = true;
        join_ctx_->TryCancel();
      }
    });
    got = stream_->Read(&ev);
    {
      absl::MutexLock lock(&mu);
      answered = true;
      cv.Signal();
    }
    watchdog.join();
  }
  if (got && ev.has_joined()) {
    const v1::JoinReply& reply = ev.joined();
    JoinAnswer a;
    a.session_id = reply.session_id();
    a.session_secret = reply.session_secret();
    a.backend = reply.backend().empty() ? "host" : reply.backend();
    a.daemon_version = reply.daemon_version();
    if (reply.has_wait_spin()) a.wait_spin = reply.wait_spin();
    a.resumed = reply.resumed();
    a.takes_captured = reply.takes_captured();
    a.takes_alltoall = reply.takes_alltoall();
    for (int r = 0; r < reply.peer_pids_size(); ++r) {
      if (reply.peer_pids(r) != 0) a.local_ranks.push_back(r);
    }
    return a;
  }
  grpc::Status st = stream_->Finish();
  stream_.reset();
  if (no_answer) {
    return absl::DeadlineExceededError(absl::StrCat("rank ", p.rank, ": dmagatherd did not answer the join of job '",
                                                    p.job_key, "' within ", p.join_timeout_ms + 10000, " ms"));
  }
  if (st.ok()) return absl::UnavailableError("dmagatherd closed the join without an answer");
  return FromGrpc(st, absl::StrCat("rank ", p.rank, " could not join job '", p.job_key, "'"));
}

void ControlChannel::StartWatcher(std::function<void(const std::string& reason, bool resumable, int code)> on_end) {
  watcher_ = std::thread([this, on_end = std::move(on_end)] {
    v1::JoinEvent e;
    std::string reason = absl::StrCat("the connection to dmagatherd at ", socket_path_, " was lost");
    bool resumable = true;
    int code = 3;  // UNAVAILABLE.
    while (stream_->Read(&e)) {
      if (e.has_shutdown()) reason = absl::StrCat("dmagatherd stopped: ", e.shutdown().reason());
      if (e.has_ended()) {
        reason = absl::StrCat("dmagatherd ended this rank's session: ", e.ended().reason());
        resumable = false;
        if (e.ended().code() != 0) code = e.ended().code();
      }
    }
    on_end(reason, resumable, code);
  });
}

void ControlChannel::Leave() {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(2000));
  v1::LeaveRequest req;
  req.set_session_id(session_id_);
  req.set_session_secret(session_secret_);
  v1::LeaveReply reply;
  stub_->Leave(&ctx, req, &reply);
}

void ControlChannel::EndStream() {
  if (stream_ == nullptr) return;
  join_ctx_->TryCancel();
  if (watcher_.joinable()) watcher_.join();
  stream_->Finish();
  stream_.reset();
}

absl::Status ControlChannel::HandOverExport(const MemoryExport& e, int rank, v1::RegisterRequest* req) {
  if (e.fd >= 0) {
    // Host memory goes to the daemon as a descriptor; Register names its ticket.
    auto handed = common::ExchangeFd(common::FdChannelPath(socket_path_), abi::kFdBuffer, e.fd, e.bytes);
    if (!handed.ok()) {
      return common::Annotate(handed.status(),
                              absl::StrCat("rank ", rank, ": handing a buffer of ", e.bytes, " bytes to dmagatherd: "));
    }
    req->set_ticket(handed->ticket);
  }
  if (e.device_fds == nullptr) return absl::OkStatus();
  // Exported device allocations, up to kMaxFdsPerRequestV1 per hand-over;
  // Register names the tickets in chunk order.
  const std::vector<common::UniqueFd>& fds = *e.device_fds;
  for (size_t i = 0; i < fds.size(); i += abi::kMaxFdsPerRequestV1) {
    std::vector<int> batch;
    uint64_t batch_bytes = 0;
    for (size_t j = i; j < fds.size() && j < i + abi::kMaxFdsPerRequestV1; ++j) {
      batch.push_back(fds[j].get());
      batch_bytes += e.chunks[j].bytes;
    }
    auto handed = common::ExchangeFds(common::FdChannelPath(socket_path_), abi::kFdDeviceMemory, batch, batch_bytes);
    if (!handed.ok()) {
      return common::Annotate(handed.status(), absl::StrCat("rank ", rank, ": handing ", fds.size(),
                                                            " device allocations to dmagatherd: "));
    }
    req->add_tickets(handed->ticket);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ControlChannel::Register(const MemoryExport& e, int rank, OwnedBuffer* owned,
                                                  uint32_t region_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(10000));
  v1::RegisterRequest req;
  req.set_session_id(session_id_);
  req.set_session_secret(session_secret_);
  req.set_memory_kind(e.memory_kind);
  req.set_bytes(e.bytes);
  DMAG_RETURN_IF_ERROR(HandOverExport(e, rank, &req));
  req.set_handle(e.handle);
  req.set_client_base(e.base);
  req.set_region_id(region_id);
  v1::RegisterReply reply;
  grpc::Status st = stub_->Register(&ctx, req, &reply);
  if (owned != nullptr) owned->Registered();
  DMAG_RETURN_IF_ERROR(
      FromGrpc(st, absl::StrCat("rank ", rank, ": registering ", e.memory_kind, " memory of ", e.bytes, " bytes")));
  return reply.region_id();
}

absl::Status ControlChannel::Resume(uint64_t gap_us, uint32_t ops_pending,
                                    const std::vector<CapturedDefinition>& captured) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(10000));
  v1::ResumeRequest req;
  req.set_session_id(session_id_);
  req.set_session_secret(session_secret_);
  req.set_gap_us(gap_us);
  req.set_ops_pending(ops_pending);
  for (const CapturedDefinition& c : captured) {
    v1::CapturedOp* op = req.add_captured();
    op->set_seq(c.seq);
    op->set_slot(c.slot);
    op->set_descriptors(c.descriptors);
  }
  v1::ResumeReply reply;
  return FromGrpc(stub_->Resume(&ctx, req, &reply), "resume");
}

absl::Status ControlChannel::Deregister(uint32_t region_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(10000));
  v1::DeregisterRequest req;
  req.set_session_id(session_id_);
  req.set_session_secret(session_secret_);
  req.set_region_id(region_id);
  v1::DeregisterReply reply;
  return FromGrpc(stub_->Deregister(&ctx, req, &reply), "deregister");
}

}  // namespace dmagather::client

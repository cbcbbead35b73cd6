#include "server/cluster/peer_io.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "common/status.h"
#include "server/cluster/job_id.h"

namespace dmagather::server::cluster {

void SetRecvTimeout(transport::Connection& conn, absl::Duration timeout) {
  if (conn.fd() < 0) return;
  timeval tv = absl::ToTimeval(timeout);
  setsockopt(conn.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

bool Readable(transport::Connection& conn, int ms) {
  pollfd p{conn.fd(), POLLIN, 0};
  return poll(&p, 1, ms) == 1;
}

absl::Status WriteMessage(transport::Connection& conn, const google::protobuf::MessageLite& msg) {
  std::string body;
  if (!msg.SerializeToString(&body)) return absl::InternalError("cannot serialize a peer message");
  const uint32_t n = static_cast<uint32_t>(body.size());
  unsigned char len[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                          static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
  return conn.Send(len, 4, body.data(), body.size());
}

absl::Status ReadMessage(transport::Connection& conn, google::protobuf::MessageLite* msg) {
  unsigned char len[4];
  DMAG_RETURN_IF_ERROR(conn.Recv(len, 4));
  const uint32_t n = uint32_t(len[0]) | uint32_t(len[1]) << 8 | uint32_t(len[2]) << 16 | uint32_t(len[3]) << 24;
  if (n > kMaxPeerMessage) {
    return absl::InvalidArgumentError(absl::StrCat("peer ", conn.peer(), " sent a ", n, "-byte message"));
  }
  std::string body(n, '\0');
  DMAG_RETURN_IF_ERROR(conn.Recv(body.data(), n));
  if (!msg->ParseFromString(body)) {
    return absl::InvalidArgumentError(absl::StrCat("peer ", conn.peer(), " sent a malformed message"));
  }
  return absl::OkStatus();
}

absl::Status ClientHandshake(transport::Connection& conn, const std::string& secret, v1::PeerHello hello, bool* retry) {
  *retry = false;
  std::string server_nonce(kNonceBytes, '\0');
  DMAG_RETURN_IF_ERROR(conn.Recv(server_nonce.data(), kNonceBytes));
  DMAG_ASSIGN_OR_RETURN(std::string nonce, common::RandomBytes(kNonceBytes));
  hello.set_protocol(kPeerProtocol);
  hello.set_nonce(nonce);
  hello.set_proof(Proof(secret, "client", server_nonce, nonce));
  DMAG_RETURN_IF_ERROR(WriteMessage(conn, hello));
  v1::PeerWelcome welcome;
  DMAG_RETURN_IF_ERROR(ReadMessage(conn, &welcome));
  if (!welcome.error().empty()) {
    *retry = welcome.retry();
    return absl::PermissionDeniedError(absl::StrCat("daemon at ", conn.peer(), " refused: ", welcome.error()));
  }
  if (!ProofEqual(welcome.proof(), Proof(secret, "server", nonce, server_nonce))) {
    return absl::PermissionDeniedError(
        absl::StrCat("daemon at ", conn.peer(), " does not hold this job's secret (wrong job id?)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::PeerHello> ReadHello(transport::Connection& conn, std::string* nonce) {
  DMAG_ASSIGN_OR_RETURN(*nonce, common::RandomBytes(kNonceBytes));
  DMAG_RETURN_IF_ERROR(conn.Send(nonce->data(), nonce->size(), nullptr, 0));
  v1::PeerHello hello;
  DMAG_RETURN_IF_ERROR(ReadMessage(conn, &hello));
  if (hello.protocol() != kPeerProtocol) {
    return absl::InvalidArgumentError(absl::StrCat("peer ", conn.peer(), " speaks peer protocol ", hello.protocol(),
                                                   ", this daemon ", kPeerProtocol));
  }
  return hello;
}

absl::Status FinishServerHandshake(transport::Connection& conn, const v1::PeerHello& hello, const std::string& nonce,
                                   const std::string& secret) {
  v1::PeerWelcome welcome;
  absl::Status result = absl::OkStatus();
  if (secret.empty()) {
    welcome.set_error("this daemon has no rank of that job (yet)");
    welcome.set_retry(true);
    result = absl::NotFoundError(absl::StrCat("peer ", conn.peer(), " asked for a job this daemon does not know"));
  } else if (!ProofEqual(hello.proof(), Proof(secret, "client", nonce, hello.nonce())) ||
             hello.nonce().size() != kNonceBytes) {
    welcome.set_error("authentication failed (wrong job secret)");
    result = absl::PermissionDeniedError(
        absl::StrCat("peer ", conn.peer(), " failed authentication for a job (wrong secret); refused"));
  } else {
    welcome.set_proof(Proof(secret, "server", hello.nonce(), nonce));
  }
  absl::Status sent = WriteMessage(conn, welcome);
  return result.ok() ? sent : result;
}

}  // namespace dmagather::server::cluster

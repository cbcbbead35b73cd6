// Messages and the authentication handshake on a daemon-to-daemon
// connection (proto/dmagather/v1/peer.proto).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dmagather/v1/peer.pb.h"
#include "google/protobuf/message_lite.h"
#include "server/transport/transport.h"

namespace dmagather::server::cluster {

inline constexpr uint32_t kPeerProtocol = 2;  // 2: links carry heartbeats and aborts backwards.
inline constexpr size_t kNonceBytes = 32;
inline constexpr uint32_t kMaxPeerMessage = 1 << 20;

// Bounds every later Recv on `conn` (0: none). tcp only (SO_RCVTIMEO).
void SetRecvTimeout(transport::Connection& conn, absl::Duration timeout);
// Waits up to `ms` for `conn` to have bytes to read.
bool Readable(transport::Connection& conn, int ms);

absl::Status WriteMessage(transport::Connection& conn, const google::protobuf::MessageLite& msg);
absl::Status ReadMessage(transport::Connection& conn, google::protobuf::MessageLite* msg);

// Connecting side: sends `hello` (role, tag, node, link filled by the
// caller; nonce and proof filled here) and checks the acceptor's proof.
// FAILED_PRECONDITION + retry=true in *retry when the acceptor does not know
// the job yet.
absl::Status ClientHandshake(transport::Connection& conn, const std::string& secret, v1::PeerHello hello, bool* retry);

// Accepting side: sends the nonce, reads the hello; the caller looks up the
// job's secret by hello.job_tag and calls FinishServerHandshake.
absl::StatusOr<v1::PeerHello> ReadHello(transport::Connection& conn, std::string* nonce);
// Checks the client's proof against `secret` ("" = job unknown: answers
// retry) and answers. OK only when the client proved the secret.
absl::Status FinishServerHandshake(transport::Connection& conn, const v1::PeerHello& hello, const std::string& nonce,
                                   const std::string& secret);

}  // namespace dmagather::server::cluster

// The public status codes (dmagather_status_t) as the daemon and the client
// library use them internally: names, and the mapping to and from
// absl::Status (Aborted means "a peer failed"; FALLBACK is the payload-marked
// FailedPrecondition of status.h, any other FailedPrecondition is misuse).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/status.h"

namespace dmagather::common {

constexpr int kNumApiStatus = 7;

inline const char* ApiStatusName(int code) {
  static constexpr const char* kNames[kNumApiStatus] = {"OK",          "FALLBACK", "INVALID_ARGUMENT", "UNAVAILABLE",
                                                        "PEER_FAILED", "TIMEOUT",  "INTERNAL"};
  return code >= 0 && code < kNumApiStatus ? kNames[code] : "UNKNOWN";
}

// absl::Status -> dmagather_status_t value.
inline int ToApiStatus(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kFailedPrecondition:
      return IsFallback(s) ? 1 : 2;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kAlreadyExists:
      return 2;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
      return 3;
    case absl::StatusCode::kAborted:
      return 4;
    case absl::StatusCode::kDeadlineExceeded:
      return 5;
    default:
      return 6;
  }
}

// dmagather_status_t value + message -> absl::Status (inverse of the above).
inline absl::Status FromApiStatus(int code, const std::string& message) {
  switch (code) {
    case 0:
      return absl::OkStatus();
    case 1:
      return FallbackError(message);
    case 2:
      return absl::InvalidArgumentError(message);
    case 3:
      return absl::UnavailableError(message);
    case 4:
      return absl::AbortedError(message);
    case 5:
      return absl::DeadlineExceededError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace dmagather::common

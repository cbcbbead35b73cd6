// Names of the public status codes (dmagather_status_t), shared by the
// client's dmagather_status_string and the daemon's telemetry.
#pragma once

namespace dmagather {

constexpr int kNumApiStatus = 7;

inline const char* ApiStatusName(int code) {
  static constexpr const char* kNames[kNumApiStatus] = {
      "OK", "FALLBACK", "INVALID_ARGUMENT", "UNAVAILABLE", "PEER_FAILED", "TIMEOUT", "INTERNAL"};
  return code >= 0 && code < kNumApiStatus ? kNames[code] : "UNKNOWN";
}

}  // namespace dmagather

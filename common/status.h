// Status helpers shared by the daemon and the client library: early-return
// macros, the translation of errno into absl::Status (done once, at the
// system-call edge, naming the call), and the FALLBACK signal.
//
// FALLBACK ("dmagather cannot serve this here; use the framework's own
// collective") is not an error code of its own in absl: it travels as a
// FailedPrecondition carrying the kFallbackPayload payload. A plain
// FailedPrecondition (misuse of an object in the wrong state) is not a
// fallback and reaches the API as INVALID_ARGUMENT.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#define DMAG_CONCAT_INNER(a, b) a##b
#define DMAG_CONCAT(a, b) DMAG_CONCAT_INNER(a, b)

#define DMAG_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status dmag_status_ = (expr);        \
    if (!dmag_status_.ok()) return dmag_status_; \
  } while (0)

#define DMAG_ASSIGN_OR_RETURN(lhs, expr) DMAG_ASSIGN_OR_RETURN_IMPL(DMAG_CONCAT(dmag_statusor_, __LINE__), lhs, expr)

#define DMAG_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

namespace dmagather::common {

inline constexpr char kFallbackPayload[] = "type.dmagather.dev/fallback";

inline absl::Status FallbackError(absl::string_view message) {
  absl::Status s = absl::FailedPreconditionError(message);
  s.SetPayload(kFallbackPayload, absl::Cord("1"));
  return s;
}

inline bool IsFallback(const absl::Status& s) {
  return s.code() == absl::StatusCode::kFailedPrecondition && s.GetPayload(kFallbackPayload).has_value();
}

// The same status with `prefix` in front of its message (payloads kept).
inline absl::Status Annotate(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  absl::Status out(s.code(), absl::StrCat(prefix, s.message()));
  s.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

// "memfd_create(dmagather-seg): Too many open files (errno 24)".
inline absl::Status ErrnoStatus(absl::string_view call, int err = errno) {
  std::string msg = absl::StrCat(call, ": ", std::strerror(err), " (errno ", err, ")");
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case EINVAL:
      return absl::InvalidArgumentError(msg);
    case ENOMEM:
    case ENOSPC:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace dmagather::common

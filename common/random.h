// Unguessable bytes from the kernel (getrandom), for capabilities: session
// secrets and fd-channel tickets.
#pragma once

#include <sys/random.h>

#include <cerrno>
#include <string>

#include "absl/status/statusor.h"
#include "common/status.h"

namespace dmagather::common {

inline absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string s(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t k = getrandom(&s[got], n - got, 0);
    if (k < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("getrandom");
    }
    got += static_cast<size_t>(k);
  }
  return s;
}

}  // namespace dmagather::common

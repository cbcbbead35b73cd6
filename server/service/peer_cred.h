// Who is on the other end of a local socket, as the kernel says
// (SO_PEERCRED at accept; pid in the daemon's pid namespace).
#pragma once

#include <sys/types.h>

namespace dmagather::server::service {

struct PeerCred {
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
};

}  // namespace dmagather::server::service

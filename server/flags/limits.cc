// dmagatherd --help, group "limits": what one user, and all users together,
// may hold of the daemon at once. Declared in server/flags/flags.h; read by
// server/main.cc.
#include "absl/flags/flag.h"
#include "server/flags/flags.h"

ABSL_FLAG(int, max_connections, 1024, "The control socket: connections open at once, all users together.");
ABSL_FLAG(int, max_connections_per_uid, 64,
          "The control socket: connections one uid may have open at once (a rank holds one); beyond it a new "
          "connection is closed at once. 0: no per-user cap.");
ABSL_FLAG(int, fd_max_connections_per_uid, 32,
          "The fd channel: connections one uid may have open at once (beyond it a new one is closed at once; when "
          "the channel's 256 slots are full, the user holding the most gives up its oldest). 0: no per-user cap.");
ABSL_FLAG(int, max_jobs_per_uid, 64, "Per-user limit: jobs one uid may have at once (0: no limit).");
ABSL_FLAG(int, max_sessions_per_uid, 1024,
          "Per-user limit: ranks (Join sessions) one uid may have open (0: no limit).");
ABSL_FLAG(int, max_regions_per_uid, 16384,
          "Per-user limit: registered buffers one uid may hold, over all its ranks (0: no limit).");
ABSL_FLAG(int64_t, max_mapped_bytes_per_uid, -1,
          "Per-user limit: host bytes one uid may have registered (mapped by the daemon). -1: this node's physical "
          "memory; 0: no limit.");

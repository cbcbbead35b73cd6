// dmagatherd --help, group "cluster": multi-node jobs, the ring between this
// node's daemon and the others, and the ibverbs transport's settings (they
// were DMAGATHER_IB_* variables). Declared in server/flags/flags.h; read by
// server/main.cc.
#include "absl/flags/flag.h"
#include "server/flags/flags.h"

ABSL_FLAG(std::string, peer_listen, "",
          "Multi-node jobs: HOST:PORT on which peer daemons reach this one (ring links, job coordinator). "
          "Empty: single-node jobs only.");
ABSL_FLAG(std::string, peer_advertise, "",
          "The HOST:PORT other nodes' daemons connect to (default: the bound --peer_listen address).");
ABSL_FLAG(std::string, transport, "auto",
          "Between daemons: tcp, ibverbs, or auto (ibverbs when an RDMA device is usable, else tcp; the "
          "reason is logged and shown by `dmagatherctl health`).");
ABSL_FLAG(int, peer_links, 4, "Multi-node jobs: connections to the next node per job (1..64).");
ABSL_FLAG(int, ring_chunk_kib, 1024, "Multi-node jobs: ring chunk size in KiB (4..65536).");
ABSL_FLAG(int, ring_transit_mib, 4096,
          "Multi-node jobs on GPU backends: pinned host memory one job's ring may hold for staging (MiB); an op "
          "that needs more is answered FALLBACK.");
ABSL_FLAG(std::string, ring_staging, "auto",
          "Multi-node jobs: auto (stage through pinned host memory only where rank memory is device memory) or "
          "always (also on the host backend: exercises the GPU backends' path on a CPU machine).");
ABSL_FLAG(int, peer_timeout_ms, 5000,
          "Multi-node jobs: a next node whose ring heartbeats (sent every fifth of this) stop for this long - "
          "its host lost power, the network between is cut, nothing closed the connection - is failed: every "
          "rank of the job gets PEER_FAILED naming it. 0: no heartbeats (only closed connections and the op "
          "timeout are noticed).");

// The ibverbs transport (docs/TRANSPORT_IBVERBS.md).
ABSL_FLAG(std::string, ib_device, "",
          "ibverbs transport: the RDMA device, optionally NAME:PORT (mlx5_1:1). Empty: the first device with an "
          "active port.");
ABSL_FLAG(int, ib_gid_index, -1, "ibverbs transport: the GID index (RoCE); -1: chosen automatically.");
ABSL_FLAG(int, ib_slots, 16, "ibverbs transport: receive staging slots per link (1..256).");
ABSL_FLAG(int64_t, ib_slot_bytes, 256 + (1 << 20),
          "ibverbs transport: bytes per staging slot: one default ring chunk (--ring_chunk_kib 1024) and 256 "
          "bytes for its frame.");

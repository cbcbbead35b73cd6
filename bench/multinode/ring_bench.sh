#!/usr/bin/env bash
# The multi-node ring (tcp over veth between network namespaces)
# against the veth line rate (iperf3) and Open MPI's MPI_Allgather over TCP
# across the same namespaces, in alternated rounds of one run. Every
# dmagather and Open MPI result is checked bit-exact. Writes
# results/multinode_ring.csv, _chunks.csv, .png and _raw.json; prints the
# table and the load (uptime) before each measurement. Needs root.
#
#   bench/multinode/ring_bench.sh [--nodes=2,4] [--sizes_kib=64,256,1024,4096,16384,65536]
#       [--rounds=2] [--links=4] [--chunk_kib=1024] [--multi_rank=2x2]
#       [--chunk_sweep=64,256,1024,4096] [--chunk_sweep_nodes=4] [--budget_mib=384] ...
#   (bench/multinode/ring_bench.py --help lists every option)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ]; then
  echo "ring_bench: needs root (it creates network namespaces, veth pairs and a bridge)" >&2
  exit 2
fi
if ! command -v ip >/dev/null || ! ip netns add ringbench-probe-$$ 2>/dev/null; then
  echo "ring_bench: cannot create network namespaces here ('ip netns add' failed: no iproute2 or no CAP_SYS_ADMIN/NET_ADMIN)" >&2
  exit 2
fi
ip netns del ringbench-probe-$$
tools/install_deps.sh --mpi
bazel build -c opt //server:dmagatherd //tools:dmagatherctl //bench/multinode:ring_ops //bench:mpi_allgather >&2
mkdir -p results
# The driver removes its namespaces on exit (normal, error, SIGINT/SIGTERM);
# this trap catches what a killed driver left (its namespaces are drb<pid>*).
/usr/bin/python3 bench/multinode/ring_bench.py "$@" &
driver=$!
trap 'kill -TERM $driver 2>/dev/null; wait $driver 2>/dev/null; for ns in $(ip netns list | awk "/^drb${driver}(sw|n[0-9]+)/ {print \$1}"); do ip netns del "$ns"; done' EXIT
trap 'exit 143' INT TERM
wait $driver

#!/usr/bin/env bash
# The main job on the embedded default (CPU backend): builds dmagatherd and
# the perf program, starts a daemon on a private socket, runs N rank
# processes through the correctness checks and the bandwidth table, stops
# the daemon. Extra arguments go to allgather_perf (e.g. --ranks=8
# --sizes_mib=1,64 --iters=50; see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
bazel build -c opt //server:dmagatherd //bench:allgather_perf //tools:dmagatherctl >&2

mkdir -p results
run_dir=$(mktemp -d /tmp/dmagather-main-XXXXXX)
sock="$run_dir/dmagatherd.sock"
bazel-bin/server/dmagatherd --socket="$sock" --backend=auto --log_level=warning 2>"$run_dir/dmagatherd.log" &
daemon=$!
cleanup() {
  kill -TERM "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  rm -rf "$run_dir"
}
trap cleanup EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "dmagatherd did not start:" >&2; cat "$run_dir/dmagatherd.log" >&2; exit 1; }

rc=0
bazel-bin/bench/allgather_perf --socket="$sock" --ranks=4 --csv=results/allgather_host.csv "$@" || rc=$?
echo "--- dmagatherctl stats ---"
bazel-bin/tools/dmagatherctl --socket="$sock" stats || true
exit $rc

#!/usr/bin/env bash
# Puts a real dmagatherd (host backend) through the robustness runs and
# prints the table of docs/OPERATIONS.md "Robustness: what the daemon was put
# through": random descriptor mutations beside a bit-exact job, rank
# SIGKILLs, daemon SIGKILL + restart cycles, a multi-job soak.
# Exit status: 0 when nothing was lost, 1 otherwise (the log says what).
#
#   bench/robustness.sh                 # the documented scale (~5 min on 2 cores: 1M mutations, 500 kills, 20 restarts, 180 s soak)
#   bench/robustness.sh --soak_s=30 --mutations=20000 --kills=20 --restarts=3   # quick
#
# Extra arguments go to bench/robustness (see --help there). The log is
# written to $ROBUSTNESS_LOG (default results/robustness-<date>.log; results/
# is ignored). The run docs/OPERATIONS.md cites: docs/perf/robustness/.
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS="${BAZEL_JOBS:-2}"
bazel build -c opt --jobs="$JOBS" //server:dmagatherd //tools:dmagatherctl //bench:robustness >&2

LOG="${ROBUSTNESS_LOG:-results/robustness-$(date +%Y%m%d-%H%M%S).log}"
mkdir -p "$(dirname "$LOG")"
ARGS=(
  --dmagatherd=bazel-bin/server/dmagatherd
  --dmagatherctl=bazel-bin/tools/dmagatherctl
  --runs=mutate,kill,restart,soak
  --op_timeout_s=5
  --mutations=1000000 --window=8 --good_ranks=3
  --kills=500 --kill_world=3
  --restarts=20
  --soak_jobs=8 --soak_ranks=4 --soak_s=180 --soak_min_kib=4 --soak_max_kib=4096
  "$@"
)
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname): $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
  echo "# bazel-bin/bench/robustness ${ARGS[*]}"
} | tee "$LOG"
set +e
/usr/bin/time -f "# wall %e s, user %U s, sys %S s, max RSS of the driver %M KiB" \
  bazel-bin/bench/robustness "${ARGS[@]}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
set -e
echo "# exit $rc; log: $LOG"
exit "$rc"

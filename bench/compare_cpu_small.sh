#!/usr/bin/env bash
# Small AllGathers: dmagather (CPU backend) against Open MPI's MPI_Allgather on
# this node, in alternated rounds (dmagather, Open MPI, dmagather, ...), each
# op preceded by a barrier on both sides and every result checked bit-exact.
# Per size: the median over rounds of each side's p50 and p99 (per-op
# latency, max over ranks), and speed = Open MPI p50 / dmagather p50 (> 1:
# dmagather faster). Writes results/compare_cpu_small.csv and .png (and each
# round's raw CSV under results/compare_cpu_small_raw/); also
# reports the daemon's CPU time while idle (5 s after the runs).
#
#   bench/compare_cpu_small.sh [--ranks=4] [--sizes_kib=4,16,64,256,1024] [--iters=500] [--rounds=3]
#
# On a machine without Bazel (e.g. one with more cores than this build
# machine): BIN=DIR takes dmagatherd, small_ops and mpi_allgather from DIR
# and installs and builds nothing; MPIRUN names Open MPI's launcher, RESULTS
# the output folder (default results/).
set -euo pipefail
# Relative BIN and RESULTS name folders of the caller's directory.
[ -n "${BIN:-}" ] && BIN="$(cd "$BIN" && pwd)"
[ -n "${RESULTS:-}" ] && { mkdir -p "$RESULTS"; RESULTS="$(cd "$RESULTS" && pwd)"; }
cd "$(dirname "$0")/.."
ranks=4; sizes=4,16,64,256,1024; iters=500; rounds=3
for a in "$@"; do
  case "$a" in
    --ranks=*) ranks=${a#*=} ;;
    --sizes_kib=*) sizes=${a#*=} ;;
    --iters=*) iters=${a#*=} ;;
    --rounds=*) rounds=${a#*=} ;;
    *) echo "unknown option $a" >&2; exit 2 ;;
  esac
done
if [ -z "${BIN:-}" ]; then
  tools/install_deps.sh --mpi
  bazel build -c opt //server:dmagatherd //bench:small_ops //bench:mpi_allgather >&2
  daemon_bin=bazel-bin/server/dmagatherd small_ops=bazel-bin/bench/small_ops mpi_allgather=bazel-bin/bench/mpi_allgather
else
  daemon_bin="$BIN/dmagatherd" small_ops="$BIN/small_ops" mpi_allgather="$BIN/mpi_allgather"
fi
results="${RESULTS:-results}"
mkdir -p "$results"
dir=$(mktemp -d /tmp/dmagather-small-XXXXXX)
"$daemon_bin" --socket="$dir/d.sock" --backend=host --log_level=warning ${DAEMON_FLAGS:-} 2>"$dir/log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [ -S "$dir/d.sock" ] && break; sleep 0.05; done
for r in $(seq "$rounds"); do
  echo "round $r/$rounds: dmagather ..." >&2
  "$small_ops" --socket="$dir/d.sock" --ranks="$ranks" --sizes_kib="$sizes" --iters="$iters" \
    >"$dir/dmag_$r.csv"
  echo "round $r/$rounds: Open MPI ..." >&2
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${MPIRUN:-mpirun}" --oversubscribe -np "$ranks" \
    "$mpi_allgather" --sizes_kib="$sizes" --iters="$iters" >"$dir/mpi_$r.csv"
done
rm -rf "$results/compare_cpu_small_raw" && mkdir -p "$results/compare_cpu_small_raw" && cp "$dir"/dmag_*.csv "$dir"/mpi_*.csv "$results/compare_cpu_small_raw/"
# The daemon idle: CPU seconds and context switches over 5 s.
read -r u0 s0 < <(awk '{print $14, $15}' /proc/$daemon/stat)
cs0=$(awk '/ctxt_switches/ {n += $2} END {print n}' /proc/$daemon/task/*/status)
sleep 5
read -r u1 s1 < <(awk '{print $14, $15}' /proc/$daemon/stat)
cs1=$(awk '/ctxt_switches/ {n += $2} END {print n}' /proc/$daemon/task/*/status)
hz=$(getconf CLK_TCK)
idle_cpu=$(awk -v a=$((u1 + s1 - u0 - s0)) -v hz="$hz" 'BEGIN {printf "%.2f", 100 * a / hz / 5}')
idle_wakeups=$(( (cs1 - cs0) / 5 ))

/usr/bin/python3 - "$dir" "$rounds" "$ranks" "$idle_cpu" "$idle_wakeups" "$results" <<'PY'
import csv, statistics, sys
d, rounds, ranks, idle_cpu, wake, results = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
def load(prefix):
    out = {}
    for r in range(1, rounds + 1):
        for row in csv.DictReader(open(f"{d}/{prefix}_{r}.csv")):
            out.setdefault(int(row["shard_KiB"]), []).append(row)
    return out
dm, mp = load("dmag"), load("mpi")
med = lambda rows, k: statistics.median(float(x[k]) for x in rows)
print(f"{ranks} ranks, {rounds} alternated rounds; per-op latency (max over ranks), median of the rounds")
hdr = f"{'shard_KiB':>9} {'dmag_p50':>9} {'dmag_p99':>9} {'mpi_p50':>9} {'mpi_p99':>9} {'speed':>6} {'p99/p50':>8}"
print(hdr)
rows = []
for k in sorted(dm):
    a50, a99, b50, b99 = med(dm[k], "p50_us"), med(dm[k], "p99_us"), med(mp[k], "p50_us"), med(mp[k], "p99_us")
    rows.append([k, a50, a99, b50, b99, b50 / a50, a99 / a50])
    print(f"{k:>9} {a50:>9.1f} {a99:>9.1f} {b50:>9.1f} {b99:>9.1f} {b50 / a50:>6.2f} {a99 / a50:>8.2f}")
print(f"daemon idle: {idle_cpu}% CPU, {wake} context switches/s")
with open(f"{results}/compare_cpu_small.csv", "w") as f:
    w = csv.writer(f)
    w.writerow(["shard_KiB", "dmagather_p50_us", "dmagather_p99_us", "openmpi_p50_us", "openmpi_p99_us",
                "speed_vs_openmpi", "dmagather_p99_over_p50"])
    w.writerows([[r[0]] + [f"{x:.2f}" for x in r[1:]] for r in rows])
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [r[0] for r in rows]
    ax.plot(ks, [r[1] for r in rows], "o-", label="dmagather p50")
    ax.plot(ks, [r[2] for r in rows], "o--", label="dmagather p99")
    ax.plot(ks, [r[3] for r in rows], "s-", label="Open MPI p50")
    ax.plot(ks, [r[4] for r in rows], "s--", label="Open MPI p99")
    ax.set_xscale("log", base=2); ax.set_yscale("log")
    ax.set_xlabel("shard per rank (KiB)"); ax.set_ylabel("per-op latency (us)")
    ax.set_title(f"Small AllGathers, {ranks} ranks, one CPU node")
    ax.grid(True, alpha=0.3); ax.legend(); fig.tight_layout()
    fig.savefig(f"{results}/compare_cpu_small.png", dpi=120)
    print(f"wrote {results}/compare_cpu_small.csv, {results}/compare_cpu_small.png")
except ImportError:
    print(f"wrote {results}/compare_cpu_small.csv (matplotlib missing: no PNG)")
PY

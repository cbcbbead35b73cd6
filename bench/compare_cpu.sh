#!/usr/bin/env bash
# dmagather (CPU backend) against Open MPI's MPI_Allgather on this node, in
# one run, on the same shard sizes and rank count. Writes
# results/compare_cpu.csv and results/compare_cpu.png and prints the table
# with the ratio dmagather / Open MPI (algorithm bandwidth, higher is better).
#
#   bench/compare_cpu.sh [--ranks=4] [--sizes_mib=1,4,16,64] [--iters=20]
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=4; sizes=1,4,16,64; iters=20
for a in "$@"; do
  case "$a" in
    --ranks=*) ranks=${a#*=} ;;
    --sizes_mib=*) sizes=${a#*=} ;;
    --iters=*) iters=${a#*=} ;;
    *) echo "unknown option $a" >&2; exit 2 ;;
  esac
done
tools/install_deps.sh --mpi
bazel build -c opt //server:dmagatherd //bench:allgather_perf //bench:mpi_allgather >&2
mkdir -p results
dir=$(mktemp -d /tmp/dmagather-cmp-XXXXXX)
bazel-bin/server/dmagatherd --socket="$dir/d.sock" --backend=host --log_level=warning 2>"$dir/log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [ -S "$dir/d.sock" ] && break; sleep 0.05; done

echo "running dmagather ($ranks ranks) ..." >&2
bazel-bin/bench/allgather_perf --socket="$dir/d.sock" --ranks="$ranks" --bw_dtypes=uint8 --sizes_mib="$sizes" \
  --iters="$iters" --check_counts=4095 --csv="$dir/dmag.csv" >"$dir/dmag.txt"
echo "running Open MPI ($ranks ranks) ..." >&2
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np "$ranks" \
  bazel-bin/bench/mpi_allgather --sizes_mib="$sizes" --iters="$iters" >"$dir/mpi.csv"

/usr/bin/python3 - "$dir/dmag.csv" "$dir/mpi.csv" "$sizes" "$ranks" <<'PY'
import csv, sys
dmag = list(csv.DictReader(open(sys.argv[1])))
mpi = list(csv.DictReader(open(sys.argv[2])))
sizes = [int(s) for s in sys.argv[3].split(",")]
ranks = sys.argv[4]
rows = []
print(f"{'shard_MiB':>9} {'data_MB':>9} {'dmag_ms':>9} {'mpi_ms':>9} {'dmag_GB/s':>10} {'mpi_GB/s':>9} {'ratio':>7}")
for s, d, m in zip(sizes, dmag, mpi):
    r = float(d["algo_BW_GBps"]) / float(m["algo_BW_GBps"])
    rows.append([s, d["data_MB"], d["avg_ms"], m["avg_ms"], d["algo_BW_GBps"], m["algo_BW_GBps"], f"{r:.2f}"])
    print(f"{s:>9} {float(d['data_MB']):>9.2f} {float(d['avg_ms']):>9.3f} {float(m['avg_ms']):>9.3f} "
          f"{float(d['algo_BW_GBps']):>10.2f} {float(m['algo_BW_GBps']):>9.2f} {r:>7.2f}")
with open("results/compare_cpu.csv", "w") as f:
    w = csv.writer(f)
    w.writerow(["shard_MiB", "data_MB", "dmagather_avg_ms", "openmpi_avg_ms", "dmagather_GBps", "openmpi_GBps", "ratio"])
    w.writerows(rows)
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(sizes, [float(r[4]) for r in rows], "o-", label="dmagather (host backend)")
    ax.plot(sizes, [float(r[5]) for r in rows], "s-", label="Open MPI MPI_Allgather")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("shard per rank (MiB)")
    ax.set_ylabel("algorithm bandwidth (GB/s)")
    ax.set_title(f"AllGather, {ranks} ranks on one CPU node")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig("results/compare_cpu.png", dpi=120)
    print("wrote results/compare_cpu.csv, results/compare_cpu.png")
except ImportError:
    print("wrote results/compare_cpu.csv (matplotlib missing: no PNG)")
PY
grep -E "^Result" "$dir/dmag.txt"

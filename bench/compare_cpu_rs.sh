#!/usr/bin/env bash
# dmagather's reduce-scatter (CPU backend) against Open MPI's
# MPI_Reduce_scatter_block and torch.distributed gloo's reduce_scatter_tensor
# on this node, in one run, on the same output sizes and rank count, SUM.
# Every result of every implementation is checked (dmagather bit-exact
# against tests/support/reduce_reference.h). Prints the table with the
# ratios dmagather / Open MPI and dmagather / gloo (algorithm bandwidth =
# input bytes per rank / time, higher is better; Open MPI in fp32 only: MPI
# has no bfloat16 datatype), and writes results/compare_cpu_rs.csv,
# results/compare_cpu_rs.txt (the table) and results/compare_cpu_rs.png.
#
# dmagather runs twice: at the default staging bound (64 MiB) and at
# --sliced_staging_mb (8) on --sliced_sizes_mib, so the path where an op
# moves in many slices is measured on its own. Then, to see where the time
# goes, reduce_scatter_perf --parts: the daemon's all-to-all alone and the
# rank's sum alone (second table). --rounds=N repeats the whole sequence
# (dmagather, dmagather sliced, Open MPI, gloo, parts) N times, alternated.
#
#   bench/compare_cpu_rs.sh [--ranks=4] [--sizes_mib=1,4,16,64] [--iters=10]
#       [--warmup=2] [--sliced_staging_mb=8] [--sliced_sizes_mib=16,64]
#       [--rounds=1] [--gloo=1]
#
# gloo: the torch of tools/install_venv.sh newest (created when missing:
# minutes and ~5.6 GB); --gloo=0 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=4; sizes=1,4,16,64; iters=10; warmup=2; sliced_mb=8; sliced_sizes=16,64; rounds=1; gloo=1
for a in "$@"; do
  case "$a" in
    --ranks=*) ranks=${a#*=} ;;
    --sizes_mib=*) sizes=${a#*=} ;;
    --iters=*) iters=${a#*=} ;;
    --warmup=*) warmup=${a#*=} ;;
    --sliced_staging_mb=*) sliced_mb=${a#*=} ;;
    --sliced_sizes_mib=*) sliced_sizes=${a#*=} ;;
    --rounds=*) rounds=${a#*=} ;;
    --gloo=*) gloo=${a#*=} ;;
    *) echo "unknown option $a" >&2; exit 2 ;;
  esac
done
tools/install_deps.sh --mpi
bazel build -c opt //server:dmagatherd //bench:reduce_scatter_perf //bench:mpi_reduce_scatter >&2
# The binaries are copied out: another build in this tree may replace
# bazel-bin (or the opt outputs) while this runs.
dir=$(mktemp -d /tmp/dmagather-cmp-rs-XXXXXX)
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
cp "$bin/server/dmagatherd" "$bin/bench/reduce_scatter_perf" "$bin/bench/mpi_reduce_scatter" "$dir/"
python=""
if [ "$gloo" = 1 ]; then
  venv=$(tools/install_venv.sh newest | sed -n 's/^venv: //p')
  python=$venv/bin/python
fi
mkdir -p results
{
  echo "commit $(git rev-parse --short HEAD); uncommitted in client/ server/ common/ abi/:" \
    "$(git status --porcelain -- client server common abi | wc -l) file(s)"
  echo "nproc $(nproc); uptime:$(uptime)"
} | tee "$dir/machine.txt" >&2
"$dir/dmagatherd" --socket="$dir/d.sock" --backend=host --log_level=warning 2>"$dir/log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [ -S "$dir/d.sock" ] && break; sleep 0.05; done

common=(--ranks="$ranks" --iters="$iters" --warmup="$warmup")
for round in $(seq "$rounds"); do
  echo "round $round: dmagather ($ranks ranks, staging 64 MiB) ..." >&2
  env -u DMAGATHER_STAGING_MB "$dir/reduce_scatter_perf" --socket="$dir/d.sock" "${common[@]}" \
    --sizes_mib="$sizes" >"$dir/dmag.$round.csv"
  echo "round $round: dmagather ($ranks ranks, staging $sliced_mb MiB) ..." >&2
  DMAGATHER_STAGING_MB=$sliced_mb "$dir/reduce_scatter_perf" --socket="$dir/d.sock" "${common[@]}" \
    --sizes_mib="$sliced_sizes" >"$dir/sliced.$round.csv"
  echo "round $round: Open MPI ($ranks ranks) ..." >&2
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np "$ranks" \
    "$dir/mpi_reduce_scatter" --sizes_mib="$sizes" --iters="$iters" --warmup="$warmup" >"$dir/mpi.$round.csv"
  if [ -n "$python" ]; then
    echo "round $round: gloo ($ranks ranks) ..." >&2
    "$python" bench/gloo_reduce_scatter.py "${common[@]}" --sizes_mib="$sizes" >"$dir/gloo.$round.csv"
  fi
  echo "round $round: dmagather parts: all-to-all alone, sum alone ..." >&2
  env -u DMAGATHER_STAGING_MB "$dir/reduce_scatter_perf" --socket="$dir/d.sock" "${common[@]}" \
    --sizes_mib="$sizes" --parts >"$dir/parts.$round.csv"
done
echo "uptime after:$(uptime)" | tee -a "$dir/machine.txt" >&2

/usr/bin/python3 - "$dir" "$rounds" <<'PY' | tee results/compare_cpu_rs.txt
import csv, glob, os, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
rows = []
for r in range(1, rounds + 1):
    for part in ("dmag", "sliced", "mpi", "gloo", "parts"):
        p = os.path.join(tmp, f"{part}.{r}.csv")
        if os.path.exists(p):
            rows += [dict(x, round=str(r), set=part) for x in csv.DictReader(open(p))]
cols = ["round", "set", "impl", "ranks", "dtype", "out_MiB", "avg_ms", "p50_ms", "algo_BW_GBps", "staging_MiB"]
with open("results/compare_cpu_rs.csv", "w") as f:
    w = csv.writer(f)
    w.writerow(cols)
    w.writerows([[x[c] for c in cols] for x in rows])

def bw(r, part, dtype, mib):
    for x in rows:
        if (x["round"], x["set"], x["dtype"], int(x["out_MiB"])) == (r, part, dtype, mib):
            return float(x["algo_BW_GBps"])
    return None

def slices(x):  # client/reduce_scatter.cc: a half of the staging holds one slice's chunk of every rank.
    n, out = int(x["ranks"]), int(x["out_MiB"]) << 20
    half = 1 << 20
    while half < n * out and half < (int(x["staging_MiB"]) << 20) // 2:
        half *= 2
    half = min(half, (int(x["staging_MiB"]) << 20) // 2)
    per = half // n
    return -(-out // per)

def f(v, spec="6.3f"):
    return format(v, spec) if v is not None else "-".rjust(int(spec.split(".")[0]))

def ratio(a, b):
    return f(a / b if a and b else None, "5.2f")

print("algo bandwidth GB/s = ranks x out bytes / time (1e9 B/s); ratio = dmagather / other, higher is better")
print(f"{'rnd':>3} {'dtype':>8} {'out_MiB':>7} {'dmag_ms':>8} {'slc':>3} {'dmag':>6} "
      f"{'d@slc':>6} {'slc':>3} {'mpi':>6} {'gloo':>6} {'d/mpi':>5} {'s/mpi':>5} {'d/glo':>5} {'s/glo':>5}")
for x in rows:
    if x["set"] != "dmag":
        continue
    r, dt, mib = x["round"], x["dtype"], int(x["out_MiB"])
    d, s = float(x["algo_BW_GBps"]), bw(r, "sliced", dt, mib)
    m, g = bw(r, "mpi", dt, mib), bw(r, "gloo", dt, mib)
    sx = next((y for y in rows if y["round"] == r and y["set"] == "sliced" and y["dtype"] == dt
               and int(y["out_MiB"]) == mib), None)
    print(f"{r:>3} {dt:>8} {mib:>7} {float(x['avg_ms']):>8.2f} {slices(x):>3} {f(d)} {f(s)} "
          f"{(slices(sx) if sx else '-'):>3} {f(m)} {f(g)} {ratio(d, m)} {ratio(s, m)} {ratio(d, g)} {ratio(s, g)}")
print("slc: slices per op at the staging bound of that column (64 MiB; then the sliced run's);"
      " d@slc: dmagather at the sliced run's bound")
print()
print("where the time goes (the parts run, staging 64 MiB): rs = the reduce-scatter again, a2a = the daemon's")
print("all-to-all alone (full-size output), sum = the rank's sum alone (all ranks at once), ms per op")
print(f"{'rnd':>3} {'dtype':>8} {'out_MiB':>7} {'rs_ms':>8} {'a2a_ms':>8} {'sum_ms':>8} {'a2a+sum':>8}")
for x in rows:
    if x["set"] != "parts" or x["impl"] != "dmagather":
        continue
    key = lambda impl: next(float(y["avg_ms"]) for y in rows if y["set"] == "parts" and y["round"] == x["round"]
                            and y["impl"] == impl and y["dtype"] == x["dtype"] and y["out_MiB"] == x["out_MiB"])
    a, s = key("alltoall"), key("local_sum")
    print(f"{x['round']:>3} {x['dtype']:>8} {x['out_MiB']:>7} {float(x['avg_ms']):>8.2f} {a:>8.2f} {s:>8.2f} {a + s:>8.2f}")
print("".join(open(os.path.join(tmp, "machine.txt"))).rstrip())
PY

/usr/bin/python3 - <<'PY'
import csv
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("wrote results/compare_cpu_rs.csv (matplotlib missing: no PNG)")
    raise SystemExit(0)
rows = [x for x in csv.DictReader(open("results/compare_cpu_rs.csv")) if x["round"] == "1"]
dtypes = sorted({x["dtype"] for x in rows})
fig, axes = plt.subplots(1, len(dtypes), figsize=(5.5 * len(dtypes), 4), squeeze=False)
for ax, dt in zip(axes[0], dtypes):
    for part, mark, color, label in [("dmag", "o-", "C0", "dmagather (host, staging 64 MiB)"),
                                     ("sliced", "o--", "C1", "dmagather (host, staging {} MiB)"),
                                     ("mpi", "s-", "C2", "Open MPI MPI_Reduce_scatter_block"),
                                     ("gloo", "^-", "C3", "gloo reduce_scatter_tensor")]:
        pts = [x for x in rows if x["set"] == part and x["dtype"] == dt]
        if pts:
            ax.plot([int(x["out_MiB"]) for x in pts], [float(x["algo_BW_GBps"]) for x in pts], mark,
                    color=color, label=label.format(pts[0]["staging_MiB"]))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("output per rank (MiB)")
    ax.set_ylabel("algorithm bandwidth (GB/s, input per rank / time)")
    ax.set_title(f"reduce-scatter SUM {dt}, {rows[0]['ranks']} ranks, one CPU node")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig("results/compare_cpu_rs.png", dpi=100)
print("wrote results/compare_cpu_rs.csv, results/compare_cpu_rs.txt, results/compare_cpu_rs.png")
PY
grep -E "WARN|ERROR|error" "$dir/log" | tail -5 >&2 || true

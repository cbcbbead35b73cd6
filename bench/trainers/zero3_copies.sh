#!/usr/bin/env bash
# DeepSpeed ZeRO-3's copies around its parameter fetches, three arms on one
# daemon (host backend, CPU, 2 ranks, DeepSpeed's CPU accelerator):
#   off     no dmagather (gloo)
#   flat    DMAGATHER_ALLGATHER=1 DMAGATHER_ZERO3_ZERO_COPY=0: DeepSpeed's flat
#           buffer, its torch.cat before and after, the gather on dmagather
#   zero    DMAGATHER_ALLGATHER=1: the zero-copy fetch
# Each arm's rank 0: aten cat / copy_ calls and elements written (a torch
# dispatch mode over the whole training), the losses' checksum (the arms must agree).
#   bench/trainers/zero3_copies.sh [OUT_DIR] [STEPS]     (table + OUT_DIR/zero3_copies.csv)
# DMAGATHER_VENV=DIR uses that venv instead of tools/install_venv.sh's.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:-results/zero3_copies}"
steps="${2:-6}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
venv="${DMAGATHER_VENV:-$(tools/install_venv.sh 2>/dev/null | sed -n "s/^venv: //p")}"
[ -x "$venv/bin/deepspeed" ] || { echo "zero3_copies: no venv with DeepSpeed (tools/install_venv.sh)"; exit 1; }
nice -n 10 bazel build //client:libdmagather.so //server:dmagatherd >/dev/null 2>&1 || { echo "build failed"; exit 1; }
bin=$(bazel info bazel-bin 2>/dev/null)
tmp=$(mktemp -d)
"$bin/server/dmagatherd" --socket="$tmp/d.sock" --backend=host --log_level=warning --metrics_listen= \
  >"$out/daemon.log" 2>&1 &
dpid=$!
trap 'kill $dpid 2>/dev/null; wait $dpid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 1 100); do [ -S "$tmp/d.sock" ] && break; sleep 0.1; done
run() {  # arm, then env switches
  local arm="$1"; shift
  echo "== $arm: $*" >&2
  env -u DMAGATHER_ALLGATHER -u DMAGATHER_ZERO3_ZERO_COPY "$@" PATH="$venv/bin:$PATH" OMP_NUM_THREADS=1 \
    DMAGATHER_LIB="$bin/client/libdmagather.so" DMAGATHER_SOCKET="$tmp/d.sock" \
    DMAGATHER_STATS_FILE="$out/$arm-stats.{rank}.json" PYTHONPATH="$PWD/client/python" \
    timeout 900 "$venv/bin/deepspeed" --num_gpus 2 --master_port $((29500 + RANDOM % 1000)) \
    bench/trainers/zero3_copies.py --prof "$out/$arm-prof.{rank}.json" -- --out "$out/$arm" --steps "$steps" \
    >"$out/$arm.log" 2>&1 || { echo "$arm failed: $out/$arm.log" >&2; tail -20 "$out/$arm.log" >&2; exit 1; }
}
run off
run flat DMAGATHER_ALLGATHER=1 DMAGATHER_ZERO3_ZERO_COPY=0
run zero DMAGATHER_ALLGATHER=1
"$venv/bin/python" - "$out" <<'PY'
import csv, json, os, sys
out = sys.argv[1]
rows = []
for arm in ("off", "flat", "zero"):
    p = json.load(open(os.path.join(out, f"{arm}-prof.0.json")))
    s = json.load(open(os.path.join(out, arm, "summary.json")))
    st = {}
    if os.path.exists(os.path.join(out, f"{arm}-stats.0.json")):
        st = json.load(open(os.path.join(out, f"{arm}-stats.0.json")))
    cat = p["copies"].get("cat", {"calls": 0, "elements": 0})
    cp = p["copies"].get("copy_", {"calls": 0, "elements": 0})
    rows.append({"arm": arm, "cat_calls": cat["calls"], "cat_elements": cat["elements"], "copy_calls": cp["calls"],
                 "copy_elements": cp["elements"], "dmagather_ops": st.get("dmagather_ops", 0),
                 "zero_copy_fetches": st.get("zero3_zero_copy_fetches", 0), "wall_s": p["wall_s"],
                 "losses_sha256": s["losses_sha256"][:16], "params_sha256": s["params_sha256"][:16]})
with open(os.path.join(out, "zero3_copies.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print(" | ".join(rows[0]))
for r in rows:
    print(" | ".join(str(v) for v in r.values()))
same = len({(r["losses_sha256"], r["params_sha256"]) for r in rows}) == 1
flat, zero = rows[1], rows[2]
print(f"losses and parameters identical in all arms: {same}")
print(f"cat elements, zero-copy vs flat: {zero['cat_elements']} vs {flat['cat_elements']} "
      f"({flat['cat_elements'] - zero['cat_elements']} fewer)")
sys.exit(0 if same else 1)
PY

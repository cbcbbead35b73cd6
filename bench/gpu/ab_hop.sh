#!/usr/bin/env bash
# A/B of the daemon hop at 4 KiB and 64 MiB between two builds staged in one directory: old/
# (dmagatherd + allgather_perf of the baseline) and bin/ (tests/gpu/run.sh stage), alternated
# twice on the same GPU. Run from the staged directory on the GPU machine; logs under $OUT.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$here/lib:${LD_LIBRARY_PATH:-}"
one() {  # dir label flags...
  local d="$1" label="$2"; shift 2
  local tmp; tmp="$(mktemp -d)"
  export DMAGATHER_SOCKET="$tmp/d.sock"
  "$here/$d/dmagatherd" --socket="$DMAGATHER_SOCKET" --backend=cuda >"$OUT/daemon_$label.log" 2>&1 &
  local dpid=$!
  for _ in $(seq 1 100); do [ -S "$DMAGATHER_SOCKET" ] && break; sleep 0.1; done
  (cd "$tmp" && timeout 120 "$here/$d/allgather_perf" "$@") > "$OUT/ab_$label.log" 2>&1
  kill -TERM "$dpid"; wait "$dpid"
  echo "$label: $(grep -E '^ +[0-9]+ +[0-9.]+' "$OUT/ab_$label.log" | tail -1 | awk '{print "e2e p50 "$2" p99 "$3}') | $(grep -o 'Execute p50 [0-9.]* us, p99 [0-9.]* us' "$OUT/daemon_$label.log") | $(grep -o 'copy calls (per device) p50 [0-9.]* us' "$OUT/daemon_$label.log")"
}
small=(--ranks=4 --check_counts=1 --sizes_mib= --latency_kib=4 --latency_iters=2000 --overlap_s=0)
large=(--ranks=4 --check_counts=1 --sizes_mib= --latency_kib=65536 --latency_iters=200 --overlap_s=0)
for round in 1 2; do
  one old "old_4k_$round" "${small[@]}"; one bin "new_4k_$round" "${small[@]}"
  one old "old_64m_$round" "${large[@]}"; one bin "new_64m_$round" "${large[@]}"
done

#!/usr/bin/env bash
# dmagatherd with Abseil's deadlock detector on (OLD: the build before
# server/main.cc turned it off) and off (NEW), host backend: small
# AllGathers timed by bench/small_ops, rounds alternated OLD, NEW, OLD, ...
# Then bench/mutex_detector (the lock patterns alone).
#
#   run.sh OLD_DMAGATHERD NEW_DMAGATHERD SMALL_OPS MUTEX_DETECTOR [ROUNDS] [RANKS]
# Writes small_ops.csv (arm,round,<small_ops CSV>) and mutex_detector.csv here or in $OUT.
set -euo pipefail
old="$1" new="$2" small_ops="$3" detector="$4" rounds="${5:-4}" ranks="${6:-2}"
out="${OUT:-$(cd "$(dirname "$0")" && pwd)}"
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
echo "arm,round,impl,ranks,shard_KiB,p50_us,p99_us,avg_us,iters" >"$out/small_ops.csv"
for r in $(seq 1 "$rounds"); do
  for arm in old new; do
    bin=$old; [ "$arm" = new ] && bin=$new
    sock="$tmp/$arm$r.sock"
    "$bin" --socket="$sock" --backend=host --log_level=warning >"$tmp/$arm$r.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
    "$small_ops" --socket="$sock" --ranks="$ranks" --sizes_kib=4,64,1024 --iters=3000 |
      grep -v '^impl' | sed "s/^/$arm,$r,/" >>"$out/small_ops.csv"
    kill "$pid"; wait "$pid" || true
  done
done
"$detector" --rounds=3 >"$out/mutex_detector.csv"
cat "$out/small_ops.csv" "$out/mutex_detector.csv"

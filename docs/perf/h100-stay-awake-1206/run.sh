#!/usr/bin/env bash
# One GPU call, from the repository root, with `tests/gpu/run.sh stage
# .carry/gpu35` carried:
#   1. CPU wake-ups per op on the cuda backend (bench/cpu_wakeups.py --device
#      cuda: 2 ranks' GPU memory, 4 KiB shards, back to back and 200 us / 1 ms
#      apart), a daemon with --stay_awake_us=0 against the default (10 ms),
#      alternated twice, with the daemon's CPU;
#   2. the GPU suite (every mode, per-rank visibility, 3 daemons) with the
#      threads kept awake as the default;
#   3. bench/gpu/ab_hop.sh "bin:--stay_awake_us=0" bin, 4 KiB x 2 ranks
#      (ops back to back: the window should change nothing there).
# Logs to $OUT. Ranks share the one GPU. PARTS picks (default: wakeups suite ab).
set -u
fc="$(cd "${1:-.carry/gpu35}" && pwd)"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
export LD_LIBRARY_PATH="$fc/lib:${LD_LIBRARY_PATH:-}"
parts=" ${PARTS:-wakeups suite ab} "
[ "${parts#* wakeups }" != "$parts" ] && for round in 1 2; do
  for awake in 0 default; do
    dir="$(mktemp -d)"
    flag=(); [ "$awake" = 0 ] && flag=(--stay_awake_us=0)
    "$fc/bin/dmagatherd" --socket="$dir/d.sock" --backend=cuda --metrics_listen= --log_level=warning "${flag[@]}" \
      >"$out/wakeups_daemon_${round}_$awake.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do [ -S "$dir/d.sock" ] && break; sleep 0.1; done
    echo "== round $round, --stay_awake_us=$awake"
    DMAGATHER_LIB="$fc/bin/libdmagather.so" PYTHONPATH=client/python timeout -k 5 100 \
      python3 bench/cpu_wakeups.py --ctl "$fc/bin/dmagatherctl" --socket "$dir/d.sock" \
      --ranks 2 --ops 1000 --gaps_us 0,200,1000 --daemon_pid "$pid" --device cuda 2>&1 | tail -n 8
    kill "$pid"; wait "$pid" 2>/dev/null
    rm -rf "$dir"
  done
done | tee "$out/wakeups.log"
if [ "${parts#* suite }" != "$parts" ]; then
t0=$SECONDS
OUT="$out/suite" timeout -k 5 300 "$fc/run.sh" run >"$out/suite.log" 2>&1
echo "suite rc=$? ($((SECONDS - t0)) s)"
grep -E "passed, |FAILED|issue watch" "$out/suite.log" | tail -10
grep -h "threads awake" "$out"/suite/*.log 2>/dev/null | head -1 | cut -c1-400
fi
if [ "${parts#* ab }" != "$parts" ]; then
  AB_SHAPES="4k_r2" OUT="$out/ab" timeout -k 5 120 "$fc/ab_hop.sh" "bin:--stay_awake_us=0" bin >"$out/ab.log" 2>&1
  echo "ab_hop rc=$?"; tail -n 6 "$out/ab.log"
fi
tar czf "$out/logs.tgz" -C "$out" . --exclude=logs.tgz 2>/dev/null

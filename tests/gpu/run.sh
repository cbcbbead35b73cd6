#!/usr/bin/env bash
# GPU tests of the cuda backend.
#
#   tests/gpu/run.sh stage DIR   (build machine) bazel build the daemon, the
#                                GPU tests and the benchmark; copy them, their
#                                .so closure and this script into DIR.
#   DIR/run.sh run               (GPU machine) start dmagatherd --backend=cuda
#                                on a private socket, run every GPU test,
#                                print "N passed, N failed".
#   DIR/run.sh restart           (GPU machine) the daemon restarted under the
#                                stream mode and under the graph mode's
#                                replays: SIGKILLs and a SIGTERM, each
#                                followed by a start on the same socket, while
#                                every rank's stream (or graph) waits on its
#                                done flags (captured reduce-scatters too);
#                                every run must still be bit-exact.
#   tests/gpu/run.sh             both, on a machine that has a GPU and Bazel.
set -u
here="$(cd "$(dirname "$0")" && pwd)"

stage() {
  local dir="$1" root
  root="$(cd "$here/../.." && pwd)"
  (cd "$root" && bazel build -c opt //server:dmagatherd //tests/gpu:allgather_gpu_test //bench:allgather_perf \
      //client:libdmagather.so //tools:dmagatherctl //bench/gpu:issue_cost //tests/gpu:reduce_gpu_test \
      //bench:reduce_sm_cost //tests/gpu:reduce_scatter_gpu_test) || exit 1
  mkdir -p "$dir/bin" "$dir/lib"
  local bins=(server/dmagatherd tests/gpu/allgather_gpu_test bench/allgather_perf client/libdmagather.so
              tools/dmagatherctl bench/gpu/issue_cost tests/gpu/reduce_gpu_test bench/reduce_sm_cost
              tests/gpu/reduce_scatter_gpu_test)
  for b in "${bins[@]}"; do
    install -m 0755 "$root/bazel-bin/$b" "$dir/bin/$(basename "$b")"
    strip "$dir/bin/$(basename "$b")" 2>/dev/null || true
  done
  # The shared libraries the GPU machine lacks (gRPC, protobuf, Abseil,
  # glog, gflags...): everything but the C library itself and the driver.
  for b in "${bins[@]}"; do ldd "$root/bazel-bin/$b"; done | awk '/=>/ {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libgcc_s|libstdc\+\+)\.so' |
    while read -r so; do cp -L "$so" "$dir/lib/"; done
  strip --strip-unneeded "$dir"/lib/*.so* 2>/dev/null || true
  install -m 0755 "$here/run.sh" "$dir/run.sh"
  install -m 0755 "$root/bench/cuda_bench.sh" "$dir/cuda_bench.sh"
  install -m 0755 "$root/bench/gpu/ab_hop.sh" "$dir/ab_hop.sh"
  du -sh "$dir"
}

run() {
  export LD_LIBRARY_PATH="$here/lib:${LD_LIBRARY_PATH:-}"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; fi  # the daemons' logs are kept there
  local tmp; tmp="$(mktemp -d)"
  export DMAGATHER_SOCKET="$tmp/dmagatherd.sock"
  # The daemon's log goes straight to $OUT when set (a run killed on a stall keeps it).
  local dlog="$tmp/daemon.log"
  [ -n "${OUT:-}" ] && dlog="$OUT/daemon_tests.log"
  # DMAGATHERD_FLAGS: extra flags for every daemon of the run (first_contact.sh's stall A/B).
  # shellcheck disable=SC2086
  "$here/bin/dmagatherd" --socket="$DMAGATHER_SOCKET" --backend=cuda --socket_mode=0666 ${DMAGATHERD_FLAGS:-} \
    >"$dlog" 2>&1 &
  local dpid=$!
  for _ in $(seq 1 100); do [ -S "$DMAGATHER_SOCKET" ] && break; sleep 0.1; done
  local passed=0 failed=0
  for mode in ${GPU_TESTS:-dtypes suballoc stream eight kill mismatch ophandles coalesced fallback vmm vmm_unshareable graph}; do
    echo "=== allgather_gpu_test $mode"
    if timeout 300 "$here/bin/allgather_gpu_test" "$mode"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  done
  # The reduce-scatter's reduction kernel against the host, bit-exact (no daemon).
  echo "=== reduce_gpu_test"
  if timeout 300 "$here/bin/reduce_gpu_test"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  # Reduce-scatter and all-to-all through the daemon, bit-exact against the reference reduction.
  for mode in ${GPU_RS_TESTS:-rs async graph alltoall}; do
    echo "=== reduce_scatter_gpu_test $mode"
    if timeout 300 "$here/bin/reduce_scatter_gpu_test" "$mode"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  done
  # The design case: each rank sees only its own GPU (CUDA_VISIBLE_DEVICES
  # = that GPU's UUID, as SLURM --gpus-per-task or a device plugin give it)
  # while the daemon sees every GPU by index; so every rank calls its GPU
  # device 0 and the daemon maps it by UUID. Bit-exact and the mapping
  # logged; with at least 4 GPUs (these modes run 3 or 4 ranks, so no two
  # ranks share a GPU) no copy may have its source and destination on one
  # GPU (same_device_copies stays as it was).
  local uuids ngpu
  uuids="$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | tr -d ' ' | paste -sd, -)"
  ngpu="$(printf '%s' "$uuids" | tr ',' '\n' | grep -c .)"
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    echo "=== per-rank visibility: skipped (CUDA_VISIBLE_DEVICES is set for the daemon; the UUID list would not match)"
  elif [ "$ngpu" -eq 0 ]; then
    echo "=== per-rank visibility: skipped (nvidia-smi lists no GPU UUID)"
  else
    "$here/bin/dmagatherctl" --socket="$DMAGATHER_SOCKET" --json stats >"$tmp/stats_before.json" 2>/dev/null
    local before_maps; before_maps="$(grep -c "is dmagatherd's device" "$dlog")"
    for mode in ${GPU_VISIBILITY_TESTS:-dtypes stream coalesced vmm}; do
      echo "=== allgather_gpu_test $mode, each rank seeing one GPU by UUID ($ngpu GPU(s))"
      if DMAGATHER_TEST_RANK_VISIBLE="$uuids" timeout 300 "$here/bin/allgather_gpu_test" "$mode"; then
        passed=$((passed + 1))
      else
        failed=$((failed + 1))
      fi
    done
    local maps; maps="$(($(grep -c "is dmagatherd's device" "$dlog") - before_maps))"
    grep "is dmagatherd's device" "$dlog" | tail -n 4
    "$here/bin/dmagatherctl" --socket="$DMAGATHER_SOCKET" --json stats >"$tmp/stats_after.json" 2>/dev/null
    local same_before same_after
    same_before="$(grep -o '"same_device_copies": *"\?[0-9]*' "$tmp/stats_before.json" | grep -o '[0-9]*$')"
    same_after="$(grep -o '"same_device_copies": *"\?[0-9]*' "$tmp/stats_after.json" | grep -o '[0-9]*$')"
    echo "=== per-rank visibility: $maps rank mapping line(s) logged; same-device copies ${same_before:-0} -> ${same_after:-0}"
    if [ "$maps" -lt 1 ]; then
      echo "FAILED: the daemon logged no rank-to-device mapping"; failed=$((failed + 1))
    elif [ "$ngpu" -ge 4 ] && [ "${same_after:-0}" != "${same_before:-0}" ]; then
      echo "FAILED: same-device copies with one rank per GPU (a rank mapped to the wrong GPU)"; failed=$((failed + 1))
    else
      passed=$((passed + 1))
    fi
  fi
  kill -TERM "$dpid"; wait "$dpid"
  echo "=== dmagatherd log (last 40 lines)"
  tail -n 40 "$dlog"

  # Multi-node on one GPU: ${GPU_NODES:-3} daemons (simulated nodes, tcp
  # between them on 127.0.0.1, ring staged through pinned host memory with
  # copy-engine H2D/D2H), ranks interleaved over them, a fresh job id per mode.
  local socks="" pids="" n
  for n in $(seq 0 $((${GPU_NODES:-3} - 1))); do
    # shellcheck disable=SC2086
    "$here/bin/dmagatherd" --socket="$tmp/node$n.sock" --backend=cuda --socket_mode=0666 --metrics_listen= \
      --peer_listen=127.0.0.1:0 ${DMAGATHERD_FLAGS:-} >"${OUT:-$tmp}/multinode_node$n.log" 2>&1 &
    pids="$pids $!"
    socks="$socks${socks:+,}$tmp/node$n.sock"
  done
  for n in $(seq 0 $((${GPU_NODES:-3} - 1))); do
    for _ in $(seq 1 100); do [ -S "$tmp/node$n.sock" ] && break; sleep 0.1; done
  done
  for mode in ${GPU_MULTINODE_TESTS:-dtypes stream coalesced ophandles}; do
    echo "=== allgather_gpu_test $mode across ${GPU_NODES:-3} daemons"
    local id
    id="$("$here/bin/dmagatherctl" --socket="$tmp/node0.sock" job-id)"
    if DMAGATHER_TEST_SOCKETS="$socks" DMAGATHER_JOB_ID="$id" timeout 300 "$here/bin/allgather_gpu_test" "$mode"; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
    fi
  done
  for n in $(seq 0 $((${GPU_NODES:-3} - 1))); do
    "$here/bin/dmagatherctl" --socket="$tmp/node$n.sock" stats | grep -E "^gputest|ring:" | head -8
  done
  kill -TERM $pids; wait $pids
  for n in $(seq 0 $((${GPU_NODES:-3} - 1))); do
    echo "=== node $n dmagatherd log (last 15 lines)"; tail -n 15 "${OUT:-$tmp}/multinode_node$n.log"
  done
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

restart() {
  export LD_LIBRARY_PATH="$here/lib:${LD_LIBRARY_PATH:-}"
  local tmp; tmp="$(mktemp -d)"
  export DMAGATHER_SOCKET="$tmp/dmagatherd.sock"
  local out="${OUT:-$tmp}" passed=0 failed=0 starts=0 dpid=""
  start_daemon() {
    starts=$((starts + 1))
    "$here/bin/dmagatherd" --socket="$DMAGATHER_SOCKET" --backend=cuda --socket_mode=0666 --metrics_listen= \
      >"$out/restart_daemon_$starts.log" 2>&1 &
    dpid=$!
    for _ in $(seq 1 200); do [ -S "$DMAGATHER_SOCKET" ] && [ -S "$DMAGATHER_SOCKET.fd" ] && break; sleep 0.05; done
  }
  ops() { "$here/bin/dmagatherctl" --socket="$DMAGATHER_SOCKET" --json stats 2>/dev/null |
          grep -o '"total_ops": *"\?[0-9]*' | grep -o '[0-9]*$'; }
  start_daemon
  # One run of TEST MODE (environment in ENV...) with the daemon restarted
  # 3 times under it, once its ops are served.
  under_restarts() {  # name test mode env...
    local name=$1 test=$2 mode=$3; shift 3
    local ops0; ops0="$(ops)"
    env "$@" timeout 300 "$here/bin/$test" "$mode" >"$out/restart_$name.log" 2>&1 &
    local tpid=$! kills=0
    # Once this run's ranks have ops served (not during their set-up).
    for _ in $(seq 1 400); do [ "$(ops)" != "" ] && [ "$(ops)" -gt "${ops0:-0}" ] && break; sleep 0.05; done
    for k in 1 2 3; do
      kill -0 "$tpid" 2>/dev/null || break
      sleep 0.$((RANDOM % 5 + 2))
      local sig=KILL; [ "$k" -eq 2 ] && sig=TERM
      local t0; t0=$(date +%s%N)
      kill -"$sig" "$dpid"; wait "$dpid" 2>/dev/null
      sleep 0.25
      start_daemon
      kills=$((kills + 1))
      echo "  $sig + restart: serving again $((($(date +%s%N) - t0) / 1000000)) ms after the signal"
    done
    if wait "$tpid"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    grep -E "PASS|FAIL|stream:|graph:" "$out/restart_$name.log"
    echo "  restarts under the run: $kills; ranks back: $(grep -c 'back on dmagatherd' "$out/restart_$name.log")"
    "$here/bin/dmagatherctl" --socket="$DMAGATHER_SOCKET" stats | grep -E "^restarts|^node" | head -3
  }
  for round in $(seq 1 "${GPU_RESTART_ROUNDS:-3}"); do
    echo "=== allgather_gpu_test stream (${GPU_RESTART_ITERS:-3000} iterations), daemon restarted under it, round $round"
    under_restarts "round$round" allgather_gpu_test stream DMAGATHER_TEST_STREAM_ITERS="${GPU_RESTART_ITERS:-3000}"
  done
  # Captured ops: the ranks' graphs replay on through the restarts, each
  # replay's data checked on the GPU; the next daemon arms the captured ops
  # again from the ranks' definitions.
  for round in $(seq 1 "${GPU_RESTART_GRAPH_ROUNDS:-2}"); do
    echo "=== allgather_gpu_test graph (${GPU_RESTART_REPLAYS:-5000} replays), daemon restarted under it, round $round"
    under_restarts "graph$round" allgather_gpu_test graph DMAGATHER_TEST_GRAPH_REPLAYS="${GPU_RESTART_REPLAYS:-5000}"
  done
  # Captured reduce-scatters and an all-to-all (their own staging, the sum
  # in the graph), each replay checked on the host.
  for round in $(seq 1 "${GPU_RESTART_RS_ROUNDS:-1}"); do
    echo "=== reduce_scatter_gpu_test graph (${GPU_RESTART_RS_REPLAYS:-1000} replays), daemon restarted under it"
    under_restarts "rsgraph$round" reduce_scatter_gpu_test graph \
      DMAGATHER_TEST_GRAPH_REPLAYS="${GPU_RESTART_RS_REPLAYS:-1000}"
  done
  kill -TERM "$dpid"; wait "$dpid"
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

case "${1:-all}" in
  stage) stage "${2:?stage DIR}" ;;
  run) run ;;
  restart) restart ;;
  all) d="$(mktemp -d)"; stage "$d" && "$d/run.sh" run ;;
  *) echo "usage: $0 [stage DIR | run]" >&2; exit 2 ;;
esac

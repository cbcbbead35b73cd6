#!/usr/bin/env bash
# first_contact.sh: the first run of dmagather's cuda backend on a
# multi-GPU NVIDIA node (8xH100/H200 class, one rank per GPU: the design
# case). One command runs, in order, what the repository can only test on a
# fake runtime and on one GPU, and writes one report with a PASS / FAIL /
# SKIP line per claim (docs/CUDA.md, "One rank per GPU"):
#
#   tools/nvidia/first_contact.sh stage DIR    (build machine: binaries, their .so closure, scripts)
#   DIR/first_contact.sh run [OUT_DIR]         (GPU machine; default OUT_DIR: $OUT or ./results/first_contact-<host>)
#
# Needs on the GPU machine: the NVIDIA driver, nvidia-smi, python3 with a
# CUDA build of torch (NCCL inside). It starts its own dmagatherd on private
# sockets (never the node's service). NVLink multicast stays off. Exit status
# 0 when no line is FAIL. Steps (the claim each stands for):
#   gpus          GPUs this run sees (CUDA_VISIBLE_DEVICES honoured), no MIG partitions
#   topology      nvidia-smi topo -m (kept in topology.txt)
#   pair copies   copy-engine GB/s for every ordered pair, pull (on the destination) and push
#                 (on the source), each copy bit-exact, from local, IPC-mapped and VMM memory
#                 (another process's, as dmagatherd reads the ranks'): the baseline (pair_bw.csv)
#   GPU suite     tests/gpu/run.sh: every mode bit-exact; then each rank seeing only its GPU by
#                 UUID while the daemon sees all, mapping logged, same_device_copies unchanged
#   pair jobs     a 2-rank job on every GPU pair, cudaMalloc (IPC) and expandable segments
#                 (VMM) memory, bit-exact; only the pair's two GPUs ran copies (dmagatherctl
#                 stats: bytes per issuing GPU)
#   latency sweep 64 KiB and 1/2/4 MiB per rank, p50/p99, and the daemon's issue p50/p99, with
#                 copy graphs on/off, graph caps 256/1024/4096 KiB, 1/4/8 streams per GPU, the
#                 threads asleep between ops (--stay_awake_us=0), and 1 MiB chunks (a 4 MiB
#                 shard as 4 chunks on 4 streams, against one chunk on one stream by default)
#   stall A/B     the GPU suite's `stream` mode (300 ops queued ahead of late ready flags)
#                 FC_STALL_RUNS (20) times per arm, each with fresh daemons: the defaults (lanes
#                 per job, lockstep, done written by the GPU), serial issue (--parallel_issue=false),
#                 done published by the CPU (--cuda_done_on_device=false), and the defaults
#                 with CUDA_DEVICE_MAX_CONNECTIONS=1 and =32; stalls out of runs per arm, and for
#                 each stall the daemon's issue-watch lines (every issuer's op and step, every
#                 rank's ready and done words, once a driver call has lasted 1 s; stall_*.log).
#                 The code before lanes and device-written done is no longer selectable.
#   latency       64 KiB..64 MiB per rank, p50/p99, against NCCL in the same run
#   16 on 8       twice as many ranks as GPUs (a gloo group: NCCL refuses shared GPUs), bit-exact
#   vs NCCL       busbw 1 MiB..1 GiB and a bf16 GEMM's TF/s beside the all-gathers, NCCL alongside
#   RS vs NCCL    the reduce-scatter (docs/REDUCE.md: chunks moved on the copy engines, each rank
#                 sums them in rank order with its own kernel), its own daemon, staging at its
#                 default (DMAGATHER_STAGING_MB unset): bf16/fp32 SUM/AVG, 1 element .. 64 MiB
#                 output per rank, in and out of place, bit-exact against a float32 rank-order
#                 reference (NCCL's differences in the last bits reported, not failed); busbw 1 MiB..
#                 1 GiB output per rank; a bf16 GEMM's TF/s beside reduce-scatters of 8..256 MiB
# FC_STEPS="pairs suite pairjobs stall sweep latency shared nccl rs" runs a subset (default: all; gpus and
# topology always run), e.g. to split the run over calls of a bounded length; FC_SWEEP
# replaces the sweep's settings (space-separated NAME[:ENV=VALUE|:--daemon_flag]).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

stage() {
  local dir="$1" root
  root="$(cd "$here/../.." && pwd)"
  "$root/bench/gpu/multi_gpu.sh" stage "$dir" || exit 1
  install -m 0755 "$root/bench/gpu/pair_bw.py" "$dir/pair_bw.py"
  install -m 0644 "$root/bench/gpu/multi_gpu_rs.py" "$dir/multi_gpu_rs.py"  # multi_gpu_bench.py's rs_* parts
  install -m 0755 "$here/first_contact.sh" "$dir/first_contact.sh"
  du -sh "$dir"
}

run() {
  local out="${1:-${OUT:-$PWD/results/first_contact-$(hostname)}}"
  mkdir -p "$out" || exit 2
  out="$(cd "$out" && pwd)"
  local report="$out/report.txt"
  : >"$report"
  want() { [[ " ${FC_STEPS:-all} " == *" all "* || " ${FC_STEPS:-all} " == *" $1 "* ]]; }
  say() { echo "$*" | tee -a "$report"; }
  pass() { say "PASS $1: $2"; }
  fail() { say "FAIL $1: $2"; }
  skip() { say "SKIP $1: $2"; }
  export LD_LIBRARY_PATH="$here/lib:${LD_LIBRARY_PATH:-}"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  unset DMAGATHER_STAGING_MB  # the reduce-scatter's staging at its default (64 MiB in all, docs/REDUCE.md)
  export PYTHONPATH="$here/python:${PYTHONPATH:-}" DMAGATHER_LIB="$here/python/dmagather/libdmagather.so"
  local tmp; tmp="$(mktemp -d)"
  say "# dmagather first contact (cuda) on $(hostname), $(date -u +%FT%TZ)"
  say "# driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)," \
      "torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null)"

  # --- gpus ----------------------------------------------------------------
  local ngpu uuids
  ngpu="$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
  nvidia-smi -L >"$out/gpus.txt" 2>&1
  if [ "${ngpu:-0}" -lt 1 ]; then
    fail "gpus" "torch sees no GPU (see gpus.txt)"
    return 1
  fi
  if grep -q "MIG " "$out/gpus.txt"; then
    fail "gpus" "MIG partitions listed: no IPC or peer access between them (docs/CUDA.md); run on whole GPUs"
  else
    pass "gpus" "$ngpu GPU(s) visible, no MIG partition"
  fi
  # The UUIDs of the GPUs this run sees, in CUDA order.
  uuids="$(python3 -c 'import torch
print(",".join("GPU-" + str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())))' \
    2>/dev/null)"

  # --- topology --------------------------------------------------------------
  if nvidia-smi topo -m >"$out/topology.txt" 2>&1; then
    pass "topology" "nvidia-smi topo -m in topology.txt"
  else
    skip "topology" "nvidia-smi topo -m failed (topology.txt)"
  fi

  # --- pair copies -------------------------------------------------------------
  if ! want pairs; then
    :
  elif (cd "$out" && timeout 900 python3 "$here/pair_bw.py" --memory local,ipc,vmm --csv "$out/pair_bw.csv") >"$out/pair_bw.log" 2>&1; then
    pass "pair copies" "$(tail -n 1 "$out/pair_bw.log") (pair_bw.csv, matrices in pair_bw.log)"
  else
    fail "pair copies" "$(tail -n 1 "$out/pair_bw.log")"
  fi

  # --- GPU suite ---------------------------------------------------------------
  local line=""
  want suite && OUT="$out" "$here/run.sh" run >"$out/gpu_suite.log" 2>&1
  want suite && line="$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out/gpu_suite.log" | tail -n 1)"
  if ! want suite; then
    :
  elif [ -n "$line" ] && [ "${line#* passed, }" = "0 failed" ]; then
    pass "GPU suite" "$line; $(grep '=== per-rank visibility' "$out/gpu_suite.log" | tail -n 1 | sed 's/^=== //')"
  else
    fail "GPU suite" "${line:-no result line} (gpu_suite.log)"
  fi

  # --- stall A/B ------------------------------------------------------------------
  run_bounded() {  # SECONDS COMMAND...: in a process group of its own, all of it killed past the limit
    local limit="$1" pid tenths=0; shift
    setsid "$@" &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
      if [ "$tenths" -ge $((limit * 10)) ]; then
        kill -TERM -- "-$pid" 2>/dev/null; sleep 2; kill -KILL -- "-$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        echo "run_bounded: killed after $limit s"
        return 124
      fi
      sleep 0.1; tenths=$((tenths + 1))
    done
    wait "$pid"
  }
  if want stall; then
    local arm runs_per="${FC_STALL_RUNS:-20}" stall_table="$out/stall_ab.txt" k
    echo "arm,runs,passed,stalled_or_failed,watch_reports" >"$out/stall_ab.csv"
    for arm in "defaults:" "serial:--parallel_issue=false" "cpu_done:--cuda_done_on_device=false" \
               "conn1:CUDA_DEVICE_MAX_CONNECTIONS=1" "conn32:CUDA_DEVICE_MAX_CONNECTIONS=32"; do
      local aname="${arm%%:*}" aset="${arm#*:}" aflags="" aenv=() ok=0 bad=0 watch=0
      case "$aset" in --*) aflags="$aset" ;; ?*) aenv=("$aset") ;; esac
      for k in $(seq 1 "$runs_per"); do
        mkdir -p "$out/stall_${aname}_$k"
        if env "${aenv[@]}" DMAGATHERD_FLAGS="$aflags" GPU_TESTS=stream GPU_VISIBILITY_TESTS=stream \
            GPU_MULTINODE_TESTS=stream OUT="$out/stall_${aname}_$k" run_bounded 150 "$here/run.sh" run \
            >"$out/stall_${aname}_$k.log" 2>&1; then
          ok=$((ok + 1))
        else
          bad=$((bad + 1))
        fi
        # The issue watch's reports, in any daemon log of the run.
        local w; w="$(cat "$out/stall_${aname}_$k"/*.log 2>/dev/null | grep -c 'issue watch:' || true)"
        watch=$((watch + ${w:-0}))
        [ "${w:-0}" -gt 0 ] && grep -h -A 10 'issue watch:' "$out/stall_${aname}_$k"/*.log \
          >>"$out/stall_${aname}_watch.txt" 2>/dev/null
      done
      echo "$aname,$runs_per,$ok,$bad,$watch" >>"$out/stall_ab.csv"
    done
    column -t -s, "$out/stall_ab.csv" >"$stall_table" 2>/dev/null || cp "$out/stall_ab.csv" "$stall_table"
    if ! awk -F, 'NR > 1 && $4 != 0 { bad = 1 } END { exit bad }' "$out/stall_ab.csv"; then
      fail "stall A/B" "a run stalled or failed (stall_ab.csv, stall_*_watch.txt)"
    else
      pass "stall A/B" "$(tail -n +2 "$out/stall_ab.csv" | wc -l) arms x $runs_per runs of the stream mode, none stalled"
    fi
    cat "$stall_table" >>"$report"
  fi

  # One daemon for the steps below, seeing every GPU by index.
  local sock="$tmp/d.sock" dpid
  start_daemon() {  # env and flags for this daemon; its log is $1
    local log="$1"; shift
    env "$@" "$here/bin/dmagatherd" --socket="$sock" --backend=cuda --socket_mode=0600 --metrics_listen= \
      ${DAEMON_FLAGS:-} >"$log" 2>&1 &
    dpid=$!
    for _ in $(seq 1 200); do [ -S "$sock" ] && return 0; sleep 0.1; done
    return 1
  }
  stop_daemon() { kill -TERM "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; }
  bench() {  # multi_gpu_bench.py arguments...
    DMAGATHER_SOCKET="$sock" timeout 1500 python3 "$here/multi_gpu_bench.py" --socket="$sock" "$@"
  }
  gpu_bytes() {  # bytes per issuing GPU from dmagatherctl stats, "d:bytes,..."
    "$here/bin/dmagatherctl" --socket="$sock" --json stats 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin)
print(",".join("%s:%s" % (c.get("device", 0), c.get("bytes", 0)) for c in s.get("copy_engines", [])))'
  }

  # --- pair jobs ---------------------------------------------------------------
  if ! want pairjobs; then
    :
  elif [ "$ngpu" -lt 2 ]; then
    skip "pair jobs" "one GPU"
  else
    start_daemon "$out/daemon_pairs.log" || { fail "pair jobs" "dmagatherd did not start"; }
    local bad=0 runs=0 i j mem before after
    for i in $(seq 0 $((ngpu - 1))); do
      for j in $(seq $((i + 1)) $((ngpu - 1))); do
        for mem in ipc vmm; do
          before="$(gpu_bytes)"
          local alloc=""; [ "$mem" = vmm ] && alloc="expandable_segments:True"
          runs=$((runs + 1))
          if ! CUDA_VISIBLE_DEVICES="$(echo "$uuids" | cut -d, -f$((i + 1))),$(echo "$uuids" | cut -d, -f$((j + 1)))" \
              PYTORCH_CUDA_ALLOC_CONF="$alloc" bench --ranks=2 --parts=correct --correct_max_mib=4 \
              --out="$out/pair_${i}_${j}_$mem" --job="pair-$i-$j-$mem" >"$out/pair_${i}_${j}_$mem.log" 2>&1; then
            bad=$((bad + 1)); say "  pair $i-$j $mem: FAILED (pair_${i}_${j}_$mem.log)"; continue
          fi
          after="$(gpu_bytes)"
          # Only GPUs i and j may have issued copies for this job.
          local other
          other="$(python3 -c '
import sys
b = dict(map(int, x.split(":")) for x in sys.argv[1].split(",") if x)
a = dict(map(int, x.split(":")) for x in sys.argv[2].split(",") if x)
i, j = int(sys.argv[3]), int(sys.argv[4])
moved = {d for d in a if a[d] != b.get(d, 0)}
print(",".join(str(d) for d in sorted(moved - {i, j})) if moved == {i, j} or moved - {i, j}
      else "GPUs %d and %d did not both count bytes" % (i, j))' "$before" "$after" "$i" "$j")"
          if [ -n "$other" ]; then
            bad=$((bad + 1)); say "  pair $i-$j $mem: copies of a job on GPUs $i and $j: $other"
          fi
          echo "pair $i-$j $mem: bytes per GPU $before -> $after" >>"$out/pair_trace.txt"
        done
      done
    done
    stop_daemon
    if [ "$bad" -eq 0 ]; then
      pass "pair jobs" "$runs runs bit-exact, copies only on each pair's GPUs (pair_trace.txt)"
    else
      fail "pair jobs" "$bad of $runs runs (see above)"
    fi
  fi

  # --- latency sweep -------------------------------------------------------------
  local ranks=$ngpu; [ "$ranks" -lt 2 ] && ranks=2
  local cfg sweep_bad=0 configs=""
  want sweep && configs="${FC_SWEEP:-graphs=on graphs=off:--cuda_graphs=false cap=256:--cuda_graph_max_kib=256
    cap=4096:--cuda_graph_max_kib=4096 streams=1:--streams=1 streams=4:--streams=4 streams=8:--streams=8
    asleep:--stay_awake_us=0 chunk1m:--chunk_kib=1024}"
  want sweep && echo "config,KiB_per_rank,impl,p50_us,p99_us,daemon_copy_calls" >"$out/latency_sweep.csv"
  for cfg in $configs; do
    local name="${cfg%%:*}" setting="" envs=() flags=""
    [ "$name" != "$cfg" ] && setting="${cfg#*:}"
    case "$setting" in
      --*) flags="$setting" ;;
      ?*) envs=("$setting") ;;
    esac
    DAEMON_FLAGS="$flags" start_daemon "$out/daemon_sweep_$name.log" "${envs[@]}" || { sweep_bad=1; continue; }
    if ! bench --ranks="$ranks" --parts=latency --latency_iters=100 --out="$out/sweep_$name" --job="sweep-$name" \
        >"$out/sweep_$name.log" 2>&1; then
      sweep_bad=1
    fi
    stop_daemon
    # The daemon's stop line: its copy calls per device (the issue cost).
    local issue; issue="$(grep -o 'copy calls (per device) p50 [0-9.]* us, p99 [0-9.]* us' \
      "$out/daemon_sweep_$name.log" | tail -n 1 | sed 's/.*device) //; s/,//')"
    tail -n +2 "$out/sweep_$name/latency.csv" 2>/dev/null | sed "s|^|$name,|; s|\$|,$issue|" >>"$out/latency_sweep.csv"
  done
  if ! want sweep; then
    :
  elif [ "$sweep_bad" -eq 0 ]; then
    pass "latency sweep" "$ranks ranks, $(echo $configs | wc -w) daemon settings (latency_sweep.csv)"
    column -t -s, "$out/latency_sweep.csv" 2>/dev/null | head -n 60 >>"$report"
  else
    fail "latency sweep" "a setting failed (sweep_*.log, daemon_sweep_*.log)"
  fi

  # --- latency 64 KiB..64 MiB against NCCL ---------------------------------------
  if ! want latency; then
    :
  elif [ "$ngpu" -lt 2 ]; then
    skip "latency" "one GPU: NCCL refuses two ranks on one GPU"
  else
    start_daemon "$out/daemon_latency.log" || fail "latency" "dmagatherd did not start"
    if bench --ranks="$ngpu" --parts=latency --latency_iters=200 \
        --latency_kib=64,256,1024,2048,4096,8192,16384,32768,65536 --out="$out/latency" --job=latency \
        >"$out/latency.log" 2>&1; then
      pass "latency" "$ngpu ranks, 64 KiB..64 MiB per rank, p50/p99 against NCCL (latency/latency.csv)"
      column -t -s, "$out/latency/latency.csv" >>"$report" 2>/dev/null
    else
      fail "latency" "see latency.log"
    fi
    stop_daemon
  fi

  # --- 16 on 8 ---------------------------------------------------------------
  want shared || want nccl && start_daemon "$out/daemon_shared.log"
  if ! want shared; then
    :
  elif bench --ranks=$((2 * ngpu)) --parts=correct --correct_max_mib=4 --out="$out/shared" --job=shared \
      >"$out/shared.log" 2>&1 && grep -q "all PASSED" "$out/shared.log"; then
    pass "$((2 * ngpu)) on $ngpu" "two ranks per GPU, bit-exact (shared.log)"
  else
    fail "$((2 * ngpu)) on $ngpu" "see shared.log"
  fi

  # --- vs NCCL ---------------------------------------------------------------
  if ! want nccl; then
    :
  elif [ "$ngpu" -lt 2 ]; then
    skip "vs NCCL" "one GPU: an all-gather of one rank moves nothing"
  elif bench --ranks="$ngpu" --parts=busbw,overlap --out="$out/vs_nccl" --job=vs-nccl >"$out/vs_nccl.log" 2>&1; then
    pass "vs NCCL" "busbw and overlap tables in vs_nccl/ (summary in vs_nccl.log)"
    tail -n 30 "$out/vs_nccl.log" >>"$report"
  else
    fail "vs NCCL" "see vs_nccl.log"
  fi
  if want shared || want nccl; then
    "$here/bin/dmagatherctl" --socket="$sock" stats >"$out/dmagatherctl_stats.txt" 2>&1
    stop_daemon
  fi

  # --- reduce-scatter vs NCCL -------------------------------------------------
  if ! want rs; then
    :
  elif [ "$ngpu" -lt 2 ]; then
    skip "RS vs NCCL" "one GPU: NCCL refuses two ranks on one GPU"
  else
    rm -f "$sock"
    if ! start_daemon "$out/daemon_rs.log"; then
      fail "RS vs NCCL" "dmagatherd did not start (daemon_rs.log)"
    elif bench --ranks="$ngpu" --parts=rs_correct,rs_busbw,rs_overlap --out="$out/rs_vs_nccl" --job=rs-vs-nccl \
        >"$out/rs_vs_nccl.log" 2>&1 && grep -q "^reduce-scatter correctness: all PASSED" "$out/rs_vs_nccl.log"; then
      pass "RS vs NCCL" "$ngpu ranks, bf16/fp32 SUM/AVG bit-exact; busbw, overlap in rs_vs_nccl/ (rs_vs_nccl.log)"
    else  # The correctness verdict where it failed, else the log's last line (a crash, a timeout).
      local why; why="$(grep -m 1 '^reduce-scatter correctness' "$out/rs_vs_nccl.log" 2>/dev/null)"
      case "$why" in "" | *"all PASSED"*) why="$(tail -n 1 "$out/rs_vs_nccl.log" 2>/dev/null)" ;; esac
      fail "RS vs NCCL" "$why (rs_vs_nccl.log)"
    fi
    tail -n 30 "$out/rs_vs_nccl.log" >>"$report" 2>/dev/null
    mkdir -p "$out/rs_vs_nccl"
    "$here/bin/dmagatherctl" --socket="$sock" stats >"$out/rs_vs_nccl/dmagatherctl_stats.txt" 2>&1
    stop_daemon
  fi
  rm -rf "$tmp"
  say "# report: $report"
  ! grep -q "^FAIL" "$report"
}

case "${1:-}" in
  stage) stage "${2:?stage DIR}" ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 stage DIR | run [OUT_DIR]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# first_contact.sh: the first run of dmagather's hip backend on an AMD node
# (MI300X / MI325X / MI355X class, ROCm 5.7+ with ROCm PyTorch). One command
# confirms on the hardware what the repository can only argue or test on
# fakes, and writes one report with a PASS / FAIL / SKIP line per claim the
# docs make (docs/AMD.md):
#
#   tools/amd/first_contact.sh [OUT_DIR]        (default: ./results/first_contact-<host>-<time>)
#
# Needs: a built tree (bazel-bin/server/dmagatherd, bazel-bin/client/
# libdmagather.so, bazel-bin/tools/dmagatherctl; it runs `bazel build` when
# they are missing), python3 with a ROCm build of torch, and rocminfo.
# Optional: rocprofv2 or rocprof (the SDMA-not-kernels check; SKIP without).
# It starts its own dmagatherd on a private socket (never the node's
# service) and stops it at the end. Every log lands in OUT_DIR; the report
# is OUT_DIR/report.txt. Exit status 0 when no line is FAIL.
#
# Checks (the claim each line stands for):
#   rocm            the ROCm, its HIP runtime and the GPUs (rocminfo; the daemon's own log line)
#   copy kind       the daemon uses the copy kind of this ROCm (NoCU from 6.1)
#   hip backend     dmagatherctl health reports backend hip
#   kernel refusal  HSA_ENABLE_SDMA=0 and GPU_FORCE_BLIT_COPY_SIZE are refused (the daemon launches no kernel)
#   bit-exact       every dtype x count, one rank per GPU (first_contact.py ranks)
#   stale read      output blocks cached in L2, reused, gathered into, read right after the wait
#   beside RCCL     dmagather and RCCL all-gather on the same tensors in the same run, both GB/s
#   per peer        bandwidth GPU 0 <-> each peer, beside RCCL
#   bad stream      INVALID_ARGUMENT, no crash (ROCm 7 crashes on bad streams)
#   SDMA            under rocprofv2/rocprof: copies seen, no kernel dispatched by dmagatherd
#   engines         with >= 2 GPUs and ROCm >= 5.7, dmagatherd assigned the SDMA engines itself (its log)
#   per engine      bytes per GPU and engine (dmagatherctl stats), every peer copy on an assigned
#                   engine; per-peer bandwidth with dmagatherd's engines beside ROCr's choice
#                   (--hip_engines=rocr)
#   GPU suite       SKIP: tests/gpu is CUDA-only; the checks above are its hip counterpart
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$PWD/results/first_contact-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"
report="$out/report.txt"
: >"$report"
say() { echo "$*" | tee -a "$report"; }
pass() { say "PASS $1: $2"; }
fail() { say "FAIL $1: $2"; }
skip() { say "SKIP $1: $2"; }

bin="$root/bazel-bin"
need=("$bin/server/dmagatherd" "$bin/client/libdmagather.so" "$bin/tools/dmagatherctl")
for f in "${need[@]}"; do
  if [[ ! -x "$f" && ! -f "$f" ]]; then
    (cd "$root" && bazel build -c opt //server:dmagatherd //client:libdmagather.so //tools:dmagatherctl //:build_config) \
      >"$out/build.log" 2>&1 || { fail "build" "bazel build failed (see build.log)"; exit 1; }
    break
  fi
done
cp "$bin/build_config.txt" "$out/" 2>/dev/null
say "# dmagather first contact on $(hostname), $(date -u +%FT%TZ), $(cd "$root" && git describe --always --dirty 2>/dev/null)"
say "# build: $(grep -E '^HIP_(PATH|VERSION)=' "$bin/build_config.txt" 2>/dev/null | tr '\n' ' ')"

# --- rocm -----------------------------------------------------------------
if command -v rocminfo >/dev/null; then
  rocminfo >"$out/rocminfo.txt" 2>&1
  gpus=$(grep -cE '^\s+Name:\s+gfx' "$out/rocminfo.txt")
  names=$(grep -E 'Marketing Name' "$out/rocminfo.txt" | grep -v CPU | sort | uniq -c | sed 's/  */ /g' | tr '\n' ';')
  if [[ "$gpus" -gt 0 ]]; then pass "rocm" "$gpus GPU agent(s):$names"; else fail "rocm" "rocminfo lists no gfx agent"; fi
else
  fail "rocm" "no rocminfo on PATH"
fi
command -v rocm-smi >/dev/null && rocm-smi --showtopo >"$out/rocm-smi-topo.txt" 2>&1

# --- the daemon -----------------------------------------------------------
sock="$out/dmagatherd.sock"
export DMAGATHER_SOCKET="$sock" DMAGATHER_LIB="$bin/client/libdmagather.so"
export PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}"
daemon_pid=""
start_daemon() {  # start_daemon LOG [VAR=VALUE | --flag ...]: waits for the socket; returns 1 when the daemon exited.
  local log="$1"; shift
  local word vars=() flags=()
  for word in "$@"; do case "$word" in --*) flags+=("$word") ;; *) vars+=("$word") ;; esac; done
  rm -f "$sock"
  env "${vars[@]}" "$bin/server/dmagatherd" --socket="$sock" --backend=hip --socket_mode=0600 --metrics_listen= \
    "${flags[@]}" >"$log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 1 200); do
    [[ -S "$sock" ]] && return 0
    kill -0 "$daemon_pid" 2>/dev/null || { wait "$daemon_pid"; daemon_pid=""; return 1; }
    sleep 0.1
  done
  return 1
}
stop_daemon() {
  [[ -n "$daemon_pid" ]] || return 0
  kill -TERM "$daemon_pid" 2>/dev/null
  wait "$daemon_pid" 2>/dev/null
  daemon_pid=""
}
trap stop_daemon EXIT

for var in HSA_ENABLE_SDMA=0 GPU_FORCE_BLIT_COPY_SIZE=64; do
  if start_daemon "$out/daemon_${var%%=*}.log" "$var"; then
    fail "kernel refusal" "dmagatherd started with $var (it must refuse: ROCm would copy with kernels)"
    stop_daemon
  elif grep -q "${var%%=*}" "$out/daemon_${var%%=*}.log"; then
    pass "kernel refusal" "$var refused: $(grep -m1 -o "${var%%=*}[^;]*" "$out/daemon_${var%%=*}.log" | head -c 160)"
  else
    fail "kernel refusal" "dmagatherd with $var did not start, but not for that reason (see daemon_${var%%=*}.log)"
  fi
done

if ! start_daemon "$out/daemon.log" DMAGATHER_FIRST_CONTACT=1; then
  fail "hip backend" "dmagatherd --backend=hip did not start: $(tail -n 3 "$out/daemon.log" | tr '\n' ' ')"
  exit 1
fi
"$bin/tools/dmagatherctl" --socket="$sock" health >"$out/health.txt" 2>&1
if grep -qE "backend:\s+hip" "$out/health.txt"; then
  pass "hip backend" "$(grep -m1 'backend:' "$out/health.txt" | tr -s ' ')"
else fail "hip backend" "$(tr '\n' ' ' <"$out/health.txt" | head -c 200)"; fi
rt=$(grep -m1 -oE 'lib[a-z_]*amdhip64[^ ,]* \(HIP runtime [0-9]+, ROCm [0-9]+\.[0-9]+\)' "$out/daemon.log")
if [[ -n "$rt" ]]; then pass "rocm" "dmagatherd opened $rt"; else fail "rocm" "no HIP runtime line in daemon.log"; fi
major=$(sed -n 's/.*ROCm \([0-9]*\)\.\([0-9]*\)).*/\1 \2/p' <<<"$rt")
kind=$(grep -m1 -o 'hipMemcpyDeviceToDevice[A-Za-z]*' "$out/daemon.log")
own_engines=0
if grep -q "SDMA engines assigned by dmagatherd" "$out/daemon.log"; then
  own_engines=1
  pass "engines" "$(grep -m1 -o 'SDMA engines assigned by dmagatherd[^;]*' "$out/daemon.log" | head -c 200)"
elif read -r maj min <<<"$major" && [[ -n "${maj:-}" ]] && [[ "${gpus:-0}" -ge 2 ]] &&
     { [[ $maj -gt 5 ]] || { [[ $maj -eq 5 ]] && [[ $min -ge 7 ]]; }; }; then
  fail "engines" "ROCm $maj.$min with $gpus GPUs, but ROCr chooses: $(grep -m1 -o 'ROCr chooses the SDMA engines.*' "$out/daemon.log" | head -c 200)"
else
  skip "engines" "ROCr chooses (one GPU or ROCm < 5.7): $(grep -m1 -o 'ROCr chooses the SDMA engines.*' "$out/daemon.log" | head -c 160)"
fi
if [[ "$own_engines" -eq 1 ]]; then
  skip "copy kind" "copies go through HSA on dmagatherd's engines; the HIP copy kind is checked in the ROCr-choice run below"
elif read -r maj min <<<"$major" && [[ -n "${maj:-}" ]]; then
  want=hipMemcpyDeviceToDevice
  { [[ $maj -gt 6 ]] || { [[ $maj -eq 6 ]] && [[ $min -ge 1 ]]; }; } && want=hipMemcpyDeviceToDeviceNoCU
  if [[ "$kind" == "$want" ]]; then pass "copy kind" "$kind for ROCm $maj.$min"
  else fail "copy kind" "daemon uses ${kind:-none}, expected $want for ROCm $maj.$min"; fi
fi

# --- ranks: bit-exact, stale read, beside RCCL; peers; bad stream -------------
python3 "$root/tools/amd/first_contact.py" ranks >"$out/ranks.txt" 2>"$out/ranks.err"
grep -E '^(PASS|FAIL|SKIP) ' "$out/ranks.txt" | tee -a "$report" >/dev/null
grep -qE '^(PASS|FAIL) ' "$out/ranks.txt" || fail "ranks" "no result (see ranks.err)"
python3 "$root/tools/amd/first_contact.py" peers >"$out/peers.txt" 2>"$out/peers.err"
grep -E '^(PASS|FAIL|SKIP) ' "$out/peers.txt" | tee -a "$report" >/dev/null
grep -qE '^(PASS|FAIL) ' "$out/peers.txt" || fail "per peer" "no result (see peers.err)"
python3 "$root/tools/amd/first_contact.py" bad_stream >"$out/bad_stream.txt" 2>&1
grep -E '^(PASS|FAIL) ' "$out/bad_stream.txt" | tee -a "$report" >/dev/null ||
  fail "bad stream" "no result: $(tail -n 2 "$out/bad_stream.txt" | tr '\n' ' ')"
"$bin/tools/dmagatherctl" --socket="$sock" stats >"$out/stats.txt" 2>&1
if grep -q "same_device_copy_on_sm" "$out/stats.txt"; then
  fail "one rank per GPU" "same_device_copy_on_sm counted with one rank per GPU (see stats.txt)"
fi
stop_daemon

# --- per engine: dmagatherd's engines, then the same peers with ROCr's choice --
if [[ "$own_engines" -eq 1 ]]; then
  line=$(grep -m1 '^copy engines:' "$out/stats.txt")
  if [[ -z "$line" ]]; then
    fail "per engine" "engines assigned, but dmagatherctl stats shows no bytes per engine (see stats.txt)"
  elif grep -q '/runtime=' <<<"$line"; then
    fail "per engine" "some peer copies were left to ROCr's choice: $line"
  else
    pass "per engine" "$line"
  fi
  if start_daemon "$out/daemon_rocr.log" --hip_engines=rocr; then
    python3 "$root/tools/amd/first_contact.py" peers >"$out/peers_rocr.txt" 2>"$out/peers_rocr.err"
    stop_daemon
    kind=$(grep -m1 -o 'hipMemcpyDeviceToDevice[A-Za-z]*' "$out/daemon_rocr.log")
    if read -r maj min <<<"$major" && [[ -n "${maj:-}" ]]; then
      want=hipMemcpyDeviceToDevice
      { [[ $maj -gt 6 ]] || { [[ $maj -eq 6 ]] && [[ $min -ge 1 ]]; }; } && want=hipMemcpyDeviceToDeviceNoCU
      if [[ "$kind" == "$want" ]]; then pass "copy kind" "$kind for ROCm $maj.$min (ROCr-choice run)"
      else fail "copy kind" "ROCr-choice run uses ${kind:-none}, expected $want for ROCm $maj.$min"; fi
    fi
    say "# per peer with ROCr's engine choice (--hip_engines=rocr), beside the lines above:"
    grep -E '^(PASS|FAIL|SKIP) ' "$out/peers_rocr.txt" | sed 's/^\(PASS\|FAIL\|SKIP\) /#   \1 /' | tee -a "$report" >/dev/null
  else
    fail "per engine" "dmagatherd --hip_engines=rocr did not start (see daemon_rocr.log)"
  fi
else
  skip "per engine" "ROCr chooses the engines on this node (see the engines line)"
fi

# --- SDMA, not kernels: the daemon under the profiler ------------------------
prof=""
command -v rocprofv2 >/dev/null && prof=rocprofv2
[[ -z "$prof" ]] && command -v rocprof >/dev/null && prof=rocprof
if [[ -z "$prof" ]]; then
  skip "SDMA" "no rocprofv2 or rocprof on PATH"
else
  mkdir -p "$out/prof"
  rm -f "$sock"
  if [[ "$prof" == rocprofv2 ]]; then
    rocprofv2 --hip-trace --hsa-trace --kernel-trace -d "$out/prof" -o daemon \
      "$bin/server/dmagatherd" --socket="$sock" --backend=hip --socket_mode=0600 --metrics_listen= >"$out/prof.log" 2>&1 &
  else
    rocprof --hip-trace --hsa-trace -d "$out/prof" -o "$out/prof/daemon.csv" \
      "$bin/server/dmagatherd" --socket="$sock" --backend=hip --socket_mode=0600 --metrics_listen= >"$out/prof.log" 2>&1 &
  fi
  daemon_pid=$!
  for _ in $(seq 1 300); do [[ -S "$sock" ]] && break; sleep 0.1; done
  python3 "$root/tools/amd/first_contact.py" ranks --sizes_mib 64 --stale_iters 10 --iters 10 \
    >"$out/prof_ranks.txt" 2>&1
  stop_daemon
  sleep 2
  copies=$(grep -rhoE 'hsa_amd_memory_async_copy(_on_engine)?|CopyDeviceToDevice|COPY_DEVICE_TO_DEVICE|hipMemcpyAsync' \
    "$out/prof" 2>/dev/null | wc -l)
  kernels=$(grep -rhoiE 'kernel[-_ ]?dispatch|KernelName|kernel_name|__amd_rocclr_[A-Za-z]+' "$out/prof" 2>/dev/null |
    grep -v -i 'name$' | wc -l)
  blit=$(grep -rhoE '__amd_rocclr_[A-Za-z]+' "$out/prof" 2>/dev/null | sort | uniq -c | tr '\n' ';')
  if [[ "$copies" -gt 0 && -z "$blit" ]]; then
    pass "SDMA" "$prof: $copies copy records in dmagatherd's trace, no blit kernel (__amd_rocclr_*)"
  elif [[ "$copies" -eq 0 ]]; then
    fail "SDMA" "$prof: no copy record in dmagatherd's trace (see prof/, prof.log)"
  else
    fail "SDMA" "$prof: dmagatherd dispatched blit kernels: $blit ($kernels kernel records)"
  fi
fi

skip "GPU suite" "tests/gpu is CUDA-only; bit-exact, stale read, bad stream above are its hip counterpart"

fails=$(grep -c '^FAIL ' "$report")
passes=$(grep -c '^PASS ' "$report")
say "# $passes PASS, $fails FAIL; report: $report"
[[ "$fails" -eq 0 ]]

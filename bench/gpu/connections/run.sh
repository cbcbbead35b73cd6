#!/usr/bin/env bash
# Does a done-wait parked on a rank's gather stream hold up its GEMMs on another
# stream?  Runs probe once per CUDA_DEVICE_MAX_CONNECTIONS setting (unset = the
# default 8, then 1, then 32): the setting is read when the context is created,
# so each needs its own process.  See README.md next to this script.
#
#   bench/gpu/connections/run.sh [probe args, e.g. --t_ms=50 --reps=3 --only=a,c]
#
# Logs: ${OUT:-/tmp}/connections_{default,1,32}.txt; the combined table is
# printed last and written to ${OUT:-/tmp}/connections_table.txt.
# Builds build/conn_probe first if it is absent (nvcc, sm_90).  Each run is
# bounded by the probe's own 20 s watchdog and by timeout(1) here.
set -u -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$here/build/conn_probe"
out="${OUT:-/tmp}"
mkdir -p "$out"

# Rebuild when absent, or when the carried binary cannot find its libraries here.
if [[ ! -x "$bin" ]] || [[ "$(ldd "$bin" 2>&1)" == *"not found"* ]]; then
  cuda="${CUDA_HOME:-/usr/local/cuda}"
  nvcc="$(command -v nvcc || echo "$cuda/bin/nvcc")"
  echo "building $bin with $nvcc"
  mkdir -p "$here/build"
  "$nvcc" -O2 -std=c++17 -arch=sm_90 "$here/probe.cu" -o "$bin" \
    -L"$cuda/lib64" -L"$cuda/lib64/stubs" -lcuda -lcublas -Xlinker -rpath="$cuda/lib64" || {
    echo "build failed" >&2
    exit 1
  }
fi

status=0
logs=()
for setting in default 1 32; do
  log="$out/connections_${setting}.txt"
  logs+=("$log")
  if [[ "$setting" == default ]]; then
    cmd=(env -u CUDA_DEVICE_MAX_CONNECTIONS "$bin" "$@")
  else
    cmd=(env CUDA_DEVICE_MAX_CONNECTIONS="$setting" "$bin" "$@")
  fi
  start=$SECONDS
  timeout -k 5 45 "${cmd[@]}" >"$log" 2>&1
  rc=$?
  echo "CUDA_DEVICE_MAX_CONNECTIONS=$setting: rc=$rc in $((SECONDS - start)) s, log $log"
  if ((rc != 0)); then
    status=1
    tail -n 5 "$log" | sed 's/^/    /'
  fi
done

table="$out/connections_table.txt"
{
  grep -h -m1 '^TABLEH' "${logs[@]}" 2>/dev/null | head -n 1 | sed 's/^TABLEH /       /'
  grep -h '^TABLE ' "${logs[@]}" 2>/dev/null | sed 's/^TABLE  /       /'
} >"$table"
echo
echo "== GEMM progress while a wait is parked (before = GEMMs done before the flag write, of N) =="
grep -h -m1 '^probe: device' "${logs[@]}" 2>/dev/null | head -n 1
grep -h -m1 '^probe: GEMM' "${logs[@]}" 2>/dev/null | head -n 1
cat "$table"
exit "$status"

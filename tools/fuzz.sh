#!/usr/bin/env bash
# fuzz.sh: builds the libFuzzer targets (tests/fuzz/*_fuzz.cc) with Debian's
# clang 14 (-fsanitize=fuzzer,address,undefined) and runs each one for a
# bounded time from its seed corpus (written by tests/fuzz/make_seeds.cc).
# A crash, leak, sanitizer report or timeout fails that target; its input is
# kept as <out>/crash-<target>-*. Ends with `N passed, N failed` (one case per
# target).
#
#   tools/fuzz.sh [-t SECONDS per target, default 20] [-j JOBS] [TARGET...]
#   tools/fuzz.sh -t 600 decode_validate        # a long run
#   DMAGATHER_FUZZ_DIR=/path tools/fuzz.sh      # build and output dir
#
# Targets: decode_validate (ingress decoder + Ingress::Validate over fake
# regions), ring (Ingress::PollOnce over two fake ranks whose tails, slots
# and completions the fuzzer controls), control_request (Join/Register
# protobufs through server/service/request_checks.cc), fd_request (the fd
# channel's ParseFdRequest).
#
# Why a script and not a Bazel config: Bazel 4.2.3's auto-configured C++
# toolchain is gcc's (found once per output base); switching it to clang
# needs CC=clang in the repository environment, which re-runs the toolchain
# detection and invalidates the whole normal tree, and gcc has no libFuzzer.
# clang++-14 compiles the dozen sources these targets need directly
# (protobuf code generated here with Debian's protoc), against the same
# Debian Abseil/protobuf/glog the daemon links; rebuilt only when a source
# under abi/ common/ server/ tests/fuzz/ proto/ (or this script) changed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
secs=20
jobs=1
while getopts "t:j:" o; do
  case $o in
    t) secs=$OPTARG ;;
    j) jobs=$OPTARG ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
ALL=(decode_validate ring control_request fd_request)
targets=("$@")
((${#targets[@]})) || targets=("${ALL[@]}")

CXX=${CXX_FUZZ:-clang++-14}
command -v "$CXX" >/dev/null || { echo "fuzz: $CXX not found (tools/install_deps.sh installs clang-14)" >&2; echo "0 passed, ${#targets[@]} failed"; exit 1; }
out=${DMAGATHER_FUZZ_DIR:-/tmp/dmagather-fuzz-$(id -u)}
mkdir -p "$out/obj" "$out/gen"

SAN=(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
CXXFLAGS=(-std=c++17 -O1 -g -Wall -Wno-sign-compare -I"$root" -I"$out/gen" "${SAN[@]}")
mapfile -t ABSL < <(grep -o '"-labsl_[a-z0-9_]*"' third_party/system/BUILD | tr -d '"')
LIBS=("${ABSL[@]}" -lprotobuf -lglog -lrt -latomic -lpthread)
LIB_SRCS=(
  server/ingress/decoder.cc server/ingress/ingress.cc server/ingress/region_table.cc
  server/scheduler/job.cc server/scheduler/planner.cc server/scheduler/rank.cc server/scheduler/persistent_op.cc
  server/engines/copy_engine.cc
  server/scheduler/completion_writer.cc common/latency_histogram.cc
  server/service/request_checks.cc server/service/fd_request.cc
)

build() {
  local stamp
  stamp=$( (cat tools/fuzz.sh third_party/system/BUILD; find abi common server tests/fuzz tests/fakes proto \
    -type f \( -name '*.h' -o -name '*.cc' -o -name '*.proto' \) -print0 | sort -z | xargs -0 cat) | sha256sum | cut -c1-16)
  [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] && return 0
  local t0=$SECONDS
  rm -f "$out/stamp" "$out"/obj/*.o
  protoc --proto_path=proto --cpp_out="$out/gen" proto/dmagather/v1/control.proto || return 1
  local srcs=("${LIB_SRCS[@]}" "$out/gen/dmagather/v1/control.pb.cc") pids=() s o
  for s in "${srcs[@]}" tests/fuzz/*_fuzz.cc; do
    o="$out/obj/$(echo "${s#"$out"/}" | tr / _).o"
    case $s in
      *_fuzz.cc) "$CXX" "${CXXFLAGS[@]}" -fsanitize=fuzzer-no-link -c "$s" -o "$o" & ;;
      *) "$CXX" "${CXXFLAGS[@]}" -fsanitize=fuzzer-no-link -c "$s" -o "$o" & ;;
    esac
    pids+=($!)
    if ((${#pids[@]} >= $(nproc))); then wait "${pids[0]}" || return 1; pids=("${pids[@]:1}"); fi
  done
  for p in "${pids[@]}"; do wait "$p" || return 1; done
  local lib=()
  for s in "${srcs[@]}"; do lib+=("$out/obj/$(echo "${s#"$out"/}" | tr / _).o"); done
  for t in "${ALL[@]}"; do
    "$CXX" "${SAN[@]}" -fsanitize=fuzzer "$out/obj/tests_fuzz_${t}_fuzz.cc.o" "${lib[@]}" "${LIBS[@]}" \
      -o "$out/$t" || return 1
  done
  # The seed writer: a plain program (no fuzzer runtime).
  "$CXX" -std=c++17 -O1 -I"$root" -I"$out/gen" tests/fuzz/make_seeds.cc "$out/gen/dmagather/v1/control.pb.cc" \
    -lprotobuf -lpthread -o "$out/make_seeds" || return 1
  echo "$stamp" >"$out/stamp"
  echo "fuzz: built ${ALL[*]} in $((SECONDS - t0)) s ($out)"
}

if ! build; then
  echo "fuzz: FAILED to build the targets" >&2
  echo "0 passed, ${#targets[@]} failed"
  exit 1
fi
rm -rf "$out/seeds" && "$out/make_seeds" "$out/seeds" || { echo "0 passed, ${#targets[@]} failed"; exit 1; }

passed=0
failed=0
for t in "${targets[@]}"; do
  [ -x "$out/$t" ] || { echo "fuzz: unknown target $t" >&2; failed=$((failed + 1)); continue; }
  mkdir -p "$out/corpus/$t"
  log="$out/$t.log"
  # -jobs > 1 runs that many fuzzing processes; each writes fuzz-N.log in
  # the working directory, so they run in $out.
  par=()
  ((jobs > 1)) && par=(-jobs="$jobs" -workers="$jobs")
  # -timeout: one input that runs 10 s is a hang; -rss_limit_mb: a leak
  # that grows without bound fails too. The working corpus ($out/corpus)
  # grows across runs; the seeds are read-only input.
  (cd "$out" && exec "$out/$t" "$out/corpus/$t" "$out/seeds/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "${par[@]}" -artifact_prefix="$out/crash-$t-") >"$log" 2>&1
  rc=$?
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
  rate=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+)/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    echo "fuzz $t: OK, $execs executions in ${secs} s ($rate/s), corpus $(ls "$out/corpus/$t" | wc -l) inputs"
  else
    failed=$((failed + 1))
    echo "fuzz $t: FAILED (exit $rc) after $execs executions; input: $(ls "$out"/crash-"$t"-* 2>/dev/null | head -1)"
    grep -E "ERROR|SUMMARY|runtime error|#[0-9]+ 0x" "$log" | head -30
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

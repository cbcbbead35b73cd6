#!/usr/bin/env bash
# CPU wake-ups per op on the host backend (the build machine, 2 cores), from
# the repository root after `bazel build //server:dmagatherd //tools:dmagatherctl
# //client:libdmagather.so`; PYTHON: a python with numpy (tools/install_venv.sh's).
set -u
dir="$(mktemp -d)"
bazel-bin/server/dmagatherd --socket="$dir/d.sock" --backend=host --metrics_listen= --log_level=warning \
  >"$dir/d.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$dir/d.sock" ] && break; sleep 0.1; done
DMAGATHER_LIB=$PWD/bazel-bin/client/libdmagather.so PYTHONPATH=client/python \
  "${PYTHON:-python3}" bench/cpu_wakeups.py --ctl bazel-bin/tools/dmagatherctl --socket "$dir/d.sock" \
  --ranks 2 --ops 2000 --gaps_us 0,200,1000
kill "$pid"; wait "$pid" 2>/dev/null
rm -rf "$dir"

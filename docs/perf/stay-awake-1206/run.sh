#!/usr/bin/env bash
# An active job keeps the daemon's threads awake (--stay_awake_us): CPU
# wake-ups per op, the op's p50 and the daemon's CPU, host backend, the
# ingress thread asleep between ops (--stay_awake_us=0, the host default)
# against awake for 10 ms after its last work (the GPU backends' default),
# alternated twice. From the repository root after `bazel build
# //server:dmagatherd //tools:dmagatherctl //client:libdmagather.so`; PYTHON:
# a python with numpy (tools/install_venv.sh's).
set -u
for round in 1 2; do
  for awake in 0 10000; do
    dir="$(mktemp -d)"
    bazel-bin/server/dmagatherd --socket="$dir/d.sock" --backend=host --metrics_listen= --log_level=warning \
      --stay_awake_us="$awake" >"$dir/d.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do [ -S "$dir/d.sock" ] && break; sleep 0.1; done
    echo "== round $round, --stay_awake_us=$awake"
    DMAGATHER_LIB=$PWD/bazel-bin/client/libdmagather.so PYTHONPATH=client/python \
      "${PYTHON:-python3}" bench/cpu_wakeups.py --ctl bazel-bin/tools/dmagatherctl --socket "$dir/d.sock" \
      --ranks 2 --ops 2000 --gaps_us 0,200,1000 --daemon_pid "$pid"
    kill "$pid"; wait "$pid" 2>/dev/null
    rm -rf "$dir"
  done
done

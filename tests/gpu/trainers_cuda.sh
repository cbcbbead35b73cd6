#!/usr/bin/env bash
# The trainer checks of tests/trainers on CUDA: unmodified DeepSpeed ZeRO-3 and
# FSDP2 runs with and without DMAGATHER_ALLGATHER=1 on the cuda backend, several
# ranks on one GPU (gloo process group: NCCL refuses two ranks on one GPU; gloo
# moves CUDA tensors), bit-identical and counted by the daemon.
#
#   tests/gpu/trainers_cuda.sh stage [DIR]  (build machine, default DIR
#       .carry/trainers-gpu) builds dmagatherd, dmagatherctl and libdmagather.so,
#       copies them with their .so closure, the Python package and its start-up
#       hook, the training scripts, and the wheels the GPU machine lacks
#       (DeepSpeed 0.19.8 and its requirements, for CPython 3.12) into DIR.
#   DIR/run.sh run [OUT] [WORLD]  (GPU machine: torch >= 2.11, no internet)
#       makes a venv over the system's packages (torch), installs the wheels
#       (the dmagather wheel too, and its daemon serves the runs; with
#       DMAGATHER_FROM_CHECKOUT=1 the staged package, library and daemon),
#       starts dmagatherd --backend=cuda, runs the checks, writes OUT
#       (default DIR/out) and ends with `N passed, N failed`.
#   DIR/run.sh rs [OUT] [WORLD]  (GPU machine) the wheel's check
#       (python3 -m dmagather.check --device cuda, against the wheel's daemon),
#       then ZeRO-3 and FSDP2 (fp32, bf16, HSDP) with DMAGATHER_REDUCE_SCATTER=1
#       beside DMAGATHER_ALLGATHER=1, each twice: the same bits both times,
#       losses within 1e-3 of the run without dmagather, every reduce-scatter served.
#   DIR/run.sh restart [OUT] [WORLD]  (GPU machine) ZeRO-3 and FSDP2 through
#       daemon restarts (SIGKILL, SIGTERM, SIGKILL under each run), bit-identical
#       to the runs without dmagather; GPU_RESTART_STEPS (40) steps each.
set -u
here="$(cd "$(dirname "$0")" && pwd)"

stage() {
  local root dir
  root="$(cd "$here/../.." && pwd)"
  dir="${1:-$root/.carry/trainers-gpu}"
  (cd "$root" && nice -n 10 bazel build //server:dmagatherd //client:libdmagather.so //tools:dmagatherctl) || exit 1
  local bin
  bin="$(cd "$root" && bazel info bazel-bin 2>/dev/null)"
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib" "$dir/python" "$dir/trainers" "$dir/wheels"
  for b in server/dmagatherd tools/dmagatherctl client/libdmagather.so; do
    install -m 0755 "$bin/$b" "$dir/bin/$(basename "$b")"
    strip "$dir/bin/$(basename "$b")" 2>/dev/null || true
  done
  for b in server/dmagatherd tools/dmagatherctl client/libdmagather.so; do ldd "$bin/$b"; done |
    awk '/=>/ {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libgcc_s|libstdc\+\+)\.so' |
    while read -r so; do cp -L "$so" "$dir/lib/"; done
  strip --strip-unneeded "$dir"/lib/*.so* 2>/dev/null || true
  cp -r "$root/client/python/dmagather" "$dir/python/"
  rm -rf "$dir/python/dmagather/__pycache__"
  cp "$root/client/python/dmagather_autoload.pth" "$dir/python/"
  cp "$root"/tests/trainers/{zero3_train.py,fsdp2_train.py,ag_script.py,clean_exit.py} "$dir/trainers/"
  cp "$here/trainers_cuda_check.py" "$dir/trainers/"
  install -m 0755 "$here/trainers_cuda.sh" "$dir/run.sh"
  # Wheels: DeepSpeed (an sdist on PyPI; the pure-Python wheel pip built for
  # the CPU venv, or one built here) and its requirements for CPython 3.12.
  local reqs=() name
  for name in einops hjson msgpack ninja packaging psutil py-cpuinfo pydantic pydantic_core annotated-types \
              typing-inspection typing_extensions tqdm; do
    reqs+=("$(grep -i "^$name==" "$root/tools/venv-requirements.txt")")
  done
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_5_x86_64 --platform any \
    -d "$dir/wheels" "${reqs[@]}" || exit 1
  local ds cache="${DMAGATHER_VENV_CACHE:-$HOME/.cache/dmagather}"
  ds=$(find "$cache/pip/wheels" -name 'deepspeed-0.19.8-py3-none-any.whl' 2>/dev/null | head -1)
  if [ -z "$ds" ]; then
    # No wheel in pip's cache (tools/install_venv.sh leaves one): build it
    # from the sdist without build isolation (DeepSpeed's setup.py must see
    # the build tools it imports, not a fresh isolated set) in a small venv
    # of its own that has them, pinned: setuptools (tools/venv-requirements.txt)
    # and wheel, which the system's python3 may lack. Made once; a stamp
    # file, written last, says it is complete. Built without torch, the
    # wheel's torch_info says 0.0; DeepSpeed reads it only to load ops
    # compiled at install, and none are (DS_BUILD_OPS=0).
    local tools="$cache/deepspeed-build-1"
    if [ ! -f "$tools/.complete" ]; then
      rm -rf "$tools"
      python3 -m venv "$tools" &&
        PIP_CACHE_DIR="$cache/pip" "$tools/bin/python" -m pip install --disable-pip-version-check --quiet \
          "$(grep -i '^setuptools==' "$root/tools/venv-requirements.txt")" wheel==0.45.1 &&
        touch "$tools/.complete" || { echo "stage: cannot make $tools" >&2; exit 1; }
    fi
    DS_BUILD_OPS=0 PIP_CACHE_DIR="$cache/pip" "$tools/bin/python" -m pip wheel --disable-pip-version-check --quiet \
      --no-deps --no-build-isolation -w "$dir/wheels" deepspeed==0.19.8 || exit 1
  else
    cp "$ds" "$dir/wheels/"
  fi
  # The dmagather wheel itself (libdmagather.so and its libraries inside): the
  # GPU machine has none of Debian's libraries, so the run proves the wheel.
  (cd "$root" && tools/build_wheel.sh "$dir/wheels") || exit 1
  ls "$dir/wheels"
  du -sh "$dir"
}

# The venv (over the system's torch) with DeepSpeed and dmagather installed,
# as a trainer would have it; sets py and work, exports PATH and the library.
prepare() {
  work="$(mktemp -d /tmp/dmagather-trainers-gpu.XXXXXX)"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  # A venv over the packages of the python3 that has torch (which may itself
  # be a venv, whose packages --system-site-packages would not see): a .pth
  # in the new venv names that interpreter's site directories.
  python3 -m venv --without-pip "$work/venv" || exit 1
  py="$work/venv/bin/python"
  local base_sites
  base_sites=$(python3 -c 'import site, sysconfig; print("\n".join(dict.fromkeys(site.getsitepackages() + [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])))')
  echo "$base_sites" >"$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/base-python.pth"
  "$py" -m pip --version >/dev/null 2>&1 || { echo "run: no pip for $py"; exit 1; }
  "$py" -m pip install --quiet --no-index --find-links "$here/wheels" deepspeed==0.19.8 2>&1 | tail -3
  local site whl
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  whl=$(ls "$here"/wheels/dmagather-*.whl 2>/dev/null | head -1)
  if [ -n "$whl" ] && [ "${DMAGATHER_FROM_CHECKOUT:-0}" != 1 ]; then
    # As a node gets it: the wheel alone (its library, its start-up hook, the
    # daemon and CLI commands with their libraries).
    "$py" -m pip install --quiet --no-index --no-deps "$whl" 2>&1 | tail -3
    unset DMAGATHER_LIB
    daemon="$work/venv/bin/dmagatherd" ctl="$work/venv/bin/dmagatherctl"
  else
    echo "$here/python" >"$site/dmagather-checkout.pth"
    cp "$here/python/dmagather_autoload.pth" "$site/"
    export DMAGATHER_LIB="$here/bin/libdmagather.so" LD_LIBRARY_PATH="$here/lib:${LD_LIBRARY_PATH:-}"
    daemon="$here/bin/dmagatherd" ctl="$here/bin/dmagatherctl"
  fi
  "$py" -c 'import torch, deepspeed; print("torch", torch.__version__, "deepspeed", deepspeed.__version__, "cuda", torch.cuda.is_available())' \
    | tee "$out/versions.txt"
  "$py" -c 'import dmagather; print("dmagather", dmagather.__file__, "library", dmagather.load_library()._name)' \
    | tee -a "$out/versions.txt"
  local elf
  elf=$("$py" -c 'import os, dmagather._commands as c; print(os.path.join(c.BIN, "dmagatherd"))' 2>/dev/null)
  [ -x "$elf" ] || elf=$daemon
  echo "daemon: $daemon ($elf: $(ldd "$elf" | grep -c dmagather.libs) libraries from the wheel)" | tee -a "$out/versions.txt"
  export PATH="$work/venv/bin:$PATH" DMAGATHER_SOCKET="$work/d.sock"
  export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
  export PYTHONFAULTHANDLER=1  # A crashing rank prints its Python stack.
}

# dmagatherd --backend=cuda on $work/d.sock, its log OUT/dmagatherd[-N].log;
# sets dpid, returns once it listens.
start_daemon() {
  rm -f "$work/d.sock" "$work/d.sock.fd"  # A killed daemon's, which would look like a listening one.
  "$daemon" --socket="$work/d.sock" --backend=cuda --log_level=warning --metrics_listen= \
    >"$out/dmagatherd${1:+-$1}.log" 2>&1 &
  dpid=$!
  for _ in $(seq 200); do [ -S "$work/d.sock" ] && [ -S "$work/d.sock.fd" ] && break; sleep 0.05; done
}

one() {  # name, env assignments..., -- , command...
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  echo "== $name"
  env -u DMAGATHER_ALLGATHER -u DS_SDMA_ALLGATHER -u DMAGATHER_FSDP_ZERO_COPY "${envs[@]}" DMAGATHER_STATS_FILE="$out/$name-stats.{rank}.json" \
    timeout "${DMAGATHER_RUN_TIMEOUT_S:-180}" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  "$ctl" --socket="$work/d.sock" --json stats >"$out/$name-daemon.json" 2>&1
  echo "$rc" >"$out/$name.rc"  # Last: the run and its daemon's counters are complete.
}

run() {
  out="${1:-$PWD/results/trainers_cuda}" world="${2:-4}"
  mkdir -p "$out"
  out="$(cd "$out" && pwd)"
  prepare
  start_daemon
  local t="$here/trainers"
  local tr=("$py" -m torch.distributed.run --standalone --nproc_per_node "$world")
  one zero3-off -- "${tr[@]}" "$t/zero3_train.py" --out "$out/zero3-off" --dtype bf16 --dist-backend gloo --steps 8 \
    --profile
  one zero3-on DMAGATHER_ALLGATHER=1 -- "${tr[@]}" "$t/zero3_train.py" --out "$out/zero3-on" --dtype bf16 \
    --dist-backend gloo --steps 8 --profile
  one zero3-both DMAGATHER_ALLGATHER=1 DS_SDMA_ALLGATHER=1 -- "${tr[@]}" "$t/zero3_train.py" \
    --out "$out/zero3-both" --dtype bf16 --dist-backend gloo --steps 8
  one zero3-flat DMAGATHER_ALLGATHER=1 DMAGATHER_ZERO3_ZERO_COPY=0 -- "${tr[@]}" "$t/zero3_train.py" \
    --out "$out/zero3-flat" --dtype bf16 --dist-backend gloo --steps 8 --profile
  # FSDP2's own reduce-scatter: gloo's reduce_scatter_tensor takes CUDA tensors.
  local f=("$t/fsdp2_train.py" --device cuda --dist-backend gloo --steps 6)
  one fsdp2-off -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-off"
  one fsdp2-on DMAGATHER_ALLGATHER=1 -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-on"
  one fsdp2-copyout DMAGATHER_ALLGATHER=1 DMAGATHER_FSDP_ZERO_COPY=0 -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-copyout"
  one fsdp2-custom -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-custom" --custom-all-gather
  one fsdp2-off-bf16 -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-off-bf16" --dtype bf16
  one fsdp2-on-bf16 DMAGATHER_ALLGATHER=1 -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-on-bf16" --dtype bf16
  # HSDP (replicate x shard, 2 x world/2): every all-gather on a shard group, each group a job of its own.
  one fsdp2-off-hsdp -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-off-hsdp" --hsdp 2
  one fsdp2-on-hsdp DMAGATHER_ALLGATHER=1 -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-on-hsdp" --hsdp 2
  # One hardware queue per process (Megatron-LM's setting): the zero-copy
  # paths' done-waits go on the consumer's stream, so nothing parks ahead of
  # compute the rank does not order after the gather.
  one fsdp2-on-conn1 DMAGATHER_ALLGATHER=1 CUDA_DEVICE_MAX_CONNECTIONS=1 -- "${tr[@]}" "${f[@]}" \
    --out "$out/fsdp2-on-conn1"
  one zero3-on-conn1 DMAGATHER_ALLGATHER=1 CUDA_DEVICE_MAX_CONNECTIONS=1 -- "${tr[@]}" "$t/zero3_train.py" \
    --out "$out/zero3-on-conn1" --dtype bf16 --dist-backend gloo --steps 8
  kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null
  "$py" "$t/trainers_cuda_check.py" "$out" "$world" | tee "$out/summary.txt"
  local rc=${PIPESTATUS[0]}
  rm -rf "$work"
  return "$rc"
}

# The daemon restarted under unmodified trainers on the GPU: ZeRO-3 and FSDP2
# (bf16, gloo) run once without dmagather and once with DMAGATHER_ALLGATHER=1
# alone while the daemon is stopped and started again on the same socket
# (SIGKILL, SIGTERM, SIGKILL, as systemd's Restart= would), each stop at a
# random moment once the run's ops are served; the checks
# (trainers_cuda_check.py --restart) want the same bytes as the run without it.
restart() {
  out="${1:-$PWD/results/trainers_cuda_restart}" world="${2:-4}"
  mkdir -p "$out"
  out="$(cd "$out" && pwd)"
  prepare
  start_daemon
  local t="$here/trainers" steps="${GPU_RESTART_STEPS:-40}"
  local tr=("$py" -m torch.distributed.run --standalone --nproc_per_node "$world")
  one zero3-off -- "${tr[@]}" "$t/zero3_train.py" --out "$out/zero3-off" --dtype bf16 --dist-backend gloo \
    --steps "$steps"
  local f=("$t/fsdp2_train.py" --device cuda --dist-backend gloo --dtype bf16 --steps "$steps")
  one fsdp2-off -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-off"
  kill -TERM "$dpid"; wait "$dpid" 2>/dev/null
  ops() { "$ctl" --socket="$work/d.sock" --json stats 2>/dev/null |
          grep -o '"total_ops": *"\?[0-9]*' | grep -o '[0-9]*$'; }
  # The daemons of one run, each started by this (background) function: it
  # restarts the daemon 3 times once the run's ops are served, at random
  # moments, logs each stop to OUT/NAME.kills, and stops the last daemon
  # once the run ended (OUT/NAME.rc).
  daemons() {
    local name=$1 n=1 k sig t0
    start_daemon "$name-1"
    touch "$out/$name.listening"
    for _ in $(seq 1 1200); do [ "$(ops)" != "" ] && [ "$(ops)" -gt 0 ] && break; sleep 0.05; done
    for k in 1 2 3; do
      sleep 0.$((RANDOM % 6 + 2))
      [ -e "$out/$name.rc" ] && break
      sig=KILL; [ "$k" -eq 2 ] && sig=TERM
      t0=$(date +%s%N)
      kill -"$sig" "$dpid"; wait "$dpid" 2>/dev/null
      sleep 0.25  # systemd's RestartSec
      n=$((n + 1))
      start_daemon "$name-$n"
      echo "$sig $((($(date +%s%N) - t0) / 1000000))" >>"$out/$name.kills"
    done
    while [ ! -e "$out/$name.rc" ]; do sleep 0.1; done
    kill -TERM "$dpid"; wait "$dpid" 2>/dev/null
  }
  local name
  for name in zero3-restart fsdp2-restart; do
    daemons "$name" &
    local kpid=$!
    while [ ! -e "$out/$name.listening" ]; do sleep 0.05; done
    if [ "$name" = zero3-restart ]; then
      one "$name" DMAGATHER_ALLGATHER=1 -- "${tr[@]}" "$t/zero3_train.py" --out "$out/$name" --dtype bf16 \
        --dist-backend gloo --steps "$steps"
    else
      one "$name" DMAGATHER_ALLGATHER=1 -- "${tr[@]}" "${f[@]}" --out "$out/$name"
    fi
    wait "$kpid"
  done
  "$py" "$t/trainers_cuda_check.py" "$out" "$world" --restart | tee "$out/summary.txt"
  local rc=${PIPESTATUS[0]}
  rm -rf "$work"
  return "$rc"
}

# The wheel's own check, then the reduce-scatter under unmodified trainers.
rs() {
  out="${1:-$PWD/results/trainers_cuda_rs}" world="${2:-4}"
  mkdir -p "$out"
  out="$(cd "$out" && pwd)"
  prepare
  start_daemon
  echo "== dmagather.check --device cuda"
  timeout 300 "$py" -m dmagather.check --device cuda --world "$world" >"$out/check.txt" 2>&1
  echo "$?" >"$out/check.rc"
  local t="$here/trainers"
  local tr=("$py" -m torch.distributed.run --standalone --nproc_per_node "$world")
  local f=("$t/fsdp2_train.py" --device cuda --dist-backend gloo --steps 6)
  local z=("$t/zero3_train.py" --dtype bf16 --dist-backend gloo --steps 8)
  local rs_on=(DMAGATHER_ALLGATHER=1 DMAGATHER_REDUCE_SCATTER=1)
  one zero3-off -- "${tr[@]}" "${z[@]}" --out "$out/zero3-off"
  one fsdp2-off -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-off"
  one fsdp2-off-bf16 -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-off-bf16" --dtype bf16 --reduce-dtype bf16
  one fsdp2-off-hsdp -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-off-hsdp" --hsdp 2
  local again
  for again in "" "-again"; do
    one "zero3-rs$again" "${rs_on[@]}" -- "${tr[@]}" "${z[@]}" --out "$out/zero3-rs$again"
    one "fsdp2-rs$again" "${rs_on[@]}" -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-rs$again"
    one "fsdp2-rs-bf16$again" "${rs_on[@]}" -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-rs-bf16$again" --dtype bf16 \
      --reduce-dtype bf16
    one "fsdp2-rs-hsdp$again" "${rs_on[@]}" -- "${tr[@]}" "${f[@]}" --out "$out/fsdp2-rs-hsdp$again" --hsdp 2
  done
  kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null
  "$py" "$t/trainers_cuda_check.py" "$out" "$world" --rs | tee "$out/summary.txt"
  local rc=${PIPESTATUS[0]}
  rm -rf "$work"
  return "$rc"
}

case "${1:-}" in
  stage) shift; stage "$@" ;;
  run) shift; run "$@" ;;
  rs) shift; rs "$@" ;;
  restart) shift; restart "$@" ;;
  *) echo "usage: $0 stage [DIR] | run [OUT] [WORLD] | rs [OUT] [WORLD] | restart [OUT] [WORLD]" >&2; exit 2 ;;
esac

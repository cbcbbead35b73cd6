#!/usr/bin/env bash
# The wheel on a clean Debian 12 root (docs/TESTING.md "Packages"): no build
# tree, no Debian package of dmagather, only what a user installs to have a
# venv. Needs root (chroot, mounts in a private mount namespace) and the
# Debian mirror (the first run: the minbase root and python3-venv).
#
#   tests/packaging/wheel.sh        ends with `N passed, N failed, N skipped`
#   (tests/packaging/run.sh runs these cases too, after the image)
#
# Cases, each on real data:
#   build_wheel      tools/build_wheel.sh into the work directory, or the file
#                    $DMAGATHER_WHEEL when set
#   wheel_venv       the minbase root (debootstrap --variant=minbase bookworm,
#                    cached by packaging/debian12_root.sh) unpacked afresh;
#                    apt-get install python3-venv (nothing else) from the
#                    mirror; python3 -m venv; pip install --no-index --no-deps
#                    of the wheel file; no dmagather package in dpkg's database
#   wheel_daemon     ldd in the root: nothing of the package "not found";
#                    $VENV/bin/dmagatherd --socket=... --backend=auto: the
#                    program inside the package; dmagatherctl health SERVING,
#                    backend host; every ELF file in the daemon's
#                    /proc/PID/maps is the wheel's or the C/C++ runtime's
#                    (or zlib, on manylinux's list)
#   wheel_python     tests/packaging/wheel_collectives.py with the venv's
#                    python (no numpy, no torch): 3 rank processes, all-gather
#                    and reduce-scatter (SUM) of float32 and bfloat16, out of
#                    place and in place, 1 / 1000 / 65537 elements, every byte
#                    compared with the values the script computes; then SIGTERM:
#                    the daemon exits 0
# Where the root cannot be had (no cached one and no mirror) or python3-venv
# cannot be installed because the mirror does not answer, the cases are
# SKIPPED and the exit status is 77.

# The cases, for this script and run.sh (which sources this file): they use
# cases.sh's ok/bad/skip, packaging/debian12_root.sh, $work, and add the
# daemon's PID to `pids` (killed by the caller's clean-up). Sets wheel_unavailable=1
# when they were skipped for want of the mirror.
# The C/C++ runtime (glibc, libstdc++, libgcc_s, libatomic), and zlib: on
# manylinux's list of what a node has (as tests/trainers/wheel_test.py), and in
# every Debian (zlib1g is Priority: required).
WHEEL_SYSTEM_LIBS='^(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libstdc\+\+\.so\.6.*|libgcc_s\.so\.1|libatomic\.so\.1.*|libz\.so\.1.*)$'
wheel_unavailable=0

# Whether the mirror answers (http and https mirrors; any other is taken as there).
wheel_mirror_answers() {
  case "$DEBIAN_MIRROR" in
    http://* | https://*)
      command -v curl >/dev/null || return 0  # cannot tell: a failure stays a failure
      curl -fsS -m 15 -o /dev/null "$DEBIAN_MIRROR/dists/bookworm/Release" 2>/dev/null ;;
    *) return 0 ;;
  esac
}

wheel_cases() {
  local wroot=$work/wheel-root venv=/root/venv sock=/run/dmagather-wheel/dmagatherd.sock
  local whl t0 tarball why out site daemon_pid health maps elf other sys f
  wroot_in() { chroot "$wroot" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
  wheel_root=$wroot

  # --- build_wheel ----------------------------------------------------------------
  echo "== build_wheel"
  if [ -n "${DMAGATHER_WHEEL:-}" ]; then
    whl=$DMAGATHER_WHEEL
    if [ -f "$whl" ]; then echo "  \$DMAGATHER_WHEEL: $whl"; ok build_wheel; else bad build_wheel "\$DMAGATHER_WHEEL=$whl: no such file"; return; fi
  elif nice -n 10 tools/build_wheel.sh "$work/wheel" >"$work/build_wheel.log" 2>&1 &&
       whl=$(sed -n 's/^wheel: //p' "$work/build_wheel.log") && [ -f "$whl" ]; then
    echo "  $(basename "$whl") $(stat -c %s "$whl") bytes"
    ok build_wheel
  else
    tail -20 "$work/build_wheel.log"
    bad build_wheel "tools/build_wheel.sh failed"
    return
  fi

  # --- wheel_venv -----------------------------------------------------------------
  echo "== wheel_venv"
  t0=$SECONDS
  if ! tarball=$(root_tarball minbase); then
    if wheel_mirror_answers; then bad wheel_venv "no minbase Debian 12 root (debootstrap failed)"; else
      skip wheel_venv "no cached minbase root and the mirror $DEBIAN_MIRROR does not answer"
      skip wheel_daemon "no root"; skip wheel_python "no root"; wheel_unavailable=1
    fi
    return
  fi
  root_unpack "$tarball" "$wroot"
  root_mount "$wroot"
  echo "  root: $(basename "$tarball") unpacked in $((SECONDS - t0)) s"
  t0=$SECONDS
  if ! root_apt "$wroot" install python3-venv >"$work/wheel-apt.log" 2>&1; then
    tail -15 "$work/wheel-apt.log"
    if wheel_mirror_answers; then bad wheel_venv "apt-get install python3-venv failed"; else
      skip wheel_venv "python3-venv not in the apt cache and the mirror $DEBIAN_MIRROR does not answer"
      skip wheel_daemon "no venv"; skip wheel_python "no venv"; wheel_unavailable=1
    fi
    return
  fi
  echo "  apt-get install python3-venv: $(grep -c '^Setting up' "$work/wheel-apt.log") packages set up," \
    "$(grep -c '^Get:' "$work/wheel-apt.log") fetched from the mirror, $((SECONDS - t0)) s"
  cp "$whl" "$wroot/tmp/"
  cp tests/packaging/wheel_collectives.py "$wroot/tmp/"
  why=""
  t0=$SECONDS
  if wroot_in python3 -m venv "$venv" >"$work/wheel-venv.log" 2>&1 &&
     wroot_in "$venv/bin/python" -m pip install --disable-pip-version-check --no-index --no-deps \
       "/tmp/$(basename "$whl")" >>"$work/wheel-venv.log" 2>&1; then
    echo "  venv and pip install: $((SECONDS - t0)) s; $(grep '^Successfully installed' "$work/wheel-venv.log")"
  else
    tail -15 "$work/wheel-venv.log"
    why+="python3 -m venv or pip install of the wheel failed; "
  fi
  site=$(wroot_in "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>&1)
  for f in "$venv/bin/dmagatherd" "$venv/bin/dmagatherctl" "$site/dmagather/bin/dmagatherd" "$site/dmagather/libdmagather.so"; do
    [ -x "$wroot$f" ] || [ -f "$wroot$f" ] || why+="$f missing; "
  done
  out=$(wroot_in dpkg-query -W -f='${Package} ${Status}\n' 2>/dev/null | grep -i dmagather | grep ' installed$')
  [ -z "$out" ] || why+="dmagather packages in the root: $out; "
  echo "  $(wroot_in python3 --version 2>&1) from Debian; $(wroot_in dpkg-query -W -f='${binary:Package} ${Version}\n' python3-venv)"
  if [ -z "$why" ]; then ok wheel_venv; else bad wheel_venv "$why"; skip wheel_daemon "no venv"; skip wheel_python "no venv"; return; fi

  # --- wheel_daemon ---------------------------------------------------------------
  echo "== wheel_daemon"
  why=""
  # What the dynamic linker of the clean root finds for the package's programs and library.
  for f in "$site/dmagather/bin/dmagatherd" "$site/dmagather/bin/dmagatherctl" "$site/dmagather/libdmagather.so"; do
    out=$(wroot_in ldd "$f" 2>&1 | grep "not found" | tr -s ' \t\n' ' ')
    [ -z "$out" ] || { echo "  ldd ${f#"$site"/}: $out"; why+="${f##*/}: $out; "; }
  done
  mkdir -p "$wroot/run/dmagather-wheel"
  # Metrics on any free port: the chroot shares the machine's network.
  chroot "$wroot" env -i PATH=/usr/bin:/bin HOME=/root "$venv/bin/dmagatherd" --socket="$sock" --backend=auto \
    --metrics_listen=127.0.0.1:0 >"$work/wheel-daemon.log" 2>&1 &
  daemon_pid=$!
  pids+=("$daemon_pid")
  for _ in $(seq 1 300); do
    [ -S "$wroot$sock.fd" ] && break
    [ -d "/proc/$daemon_pid" ] || break
    sleep 0.1
  done
  health=$(wroot_in "$venv/bin/dmagatherctl" --socket="$sock" health 2>&1)
  echo "$health" | sed 's/^/  /' | grep -E '^  (status|version|backend|built):' | cut -c1-160
  grep -qE '^status:\s+SERVING' <<<"$health" || why+="dmagatherctl health: not SERVING; "
  grep -qE '^backend:\s+host( |$)' <<<"$health" || why+="backend is not host; "
  if [ -d "/proc/$daemon_pid" ]; then
    echo "  exe: $(wroot_in readlink "/proc/$daemon_pid/exe")"
    [ "$(wroot_in readlink "/proc/$daemon_pid/exe")" = "$site/dmagather/bin/dmagatherd" ] ||
      why+="the daemon is not the package's program; "
    # Paths as the chroot sees them (maps are printed against the reader's root).
    maps=$(wroot_in cat "/proc/$daemon_pid/maps" | awk '$6 ~ /^\// {print $6}' | sort -u)
    elf="" other="" sys=""
    while read -r f; do
      [ -n "$f" ] || continue
      if [ -f "$wroot$f" ] && [ "$(head -c 4 "$wroot$f" | od -An -c | tr -d ' ')" = '177ELF' ]; then
        case "$f" in
          "$site/dmagather/"* | "$site/dmagather.libs/"*) ;;
          *) grep -qE "$WHEEL_SYSTEM_LIBS" <<<"$(basename "$f")" && sys+="${f##*/} " || elf+="$f " ;;
        esac
      else
        other+="$f "
      fi
    done <<<"$maps"
    echo "  from the root: ${sys:-nothing}"
    echo "  $(grep -c "^$site/dmagather" <<<"$maps") files mapped from the wheel" \
      "($(grep -c "^$site/dmagather.libs/" <<<"$maps") of dmagather.libs); not ELF: ${other:-none}"
    [ -z "$elf" ] || why+="libraries of the daemon from outside the wheel: $elf; "
    grep -q "^$site/dmagather.libs/libgrpc" <<<"$maps" || why+="no libgrpc of the wheel mapped; "
  else
    why+="the daemon exited: $(tail -3 "$work/wheel-daemon.log" | tr '\n' ' '); "
  fi
  if [ -z "$why" ]; then ok wheel_daemon; else bad wheel_daemon "$why"; fi

  # --- wheel_python ---------------------------------------------------------------
  echo "== wheel_python"
  why=""
  if [ -d "/proc/$daemon_pid" ]; then
    if wroot_in "$venv/bin/python" /tmp/wheel_collectives.py --socket="$sock" --world 3 >"$work/wheel-py.log" 2>&1 &&
       grep -q '^PASS: 3 ranks' "$work/wheel-py.log"; then :; else why+="the ranks' check failed; "; fi
    sed 's/^/  /' "$work/wheel-py.log" | cut -c1-220
    grep -q "^rank 0: dmagather $site/dmagather/__init__.py library $site/dmagather/libdmagather.so " "$work/wheel-py.log" ||
      why+="the package or its library not the venv's; "
    kill -TERM "$daemon_pid"
    wait "$daemon_pid"
    out=$?
    [ "$out" -eq 0 ] || why+="the daemon exited $out at SIGTERM; "
    [ ! -e "$wroot$sock" ] || why+="the daemon left its socket; "
  else
    why+="no daemon; "
  fi
  if [ -z "$why" ]; then ok wheel_python; else bad wheel_python "$why"; fi
}

wheel_cleanup() {
  [ -n "${wheel_root:-}" ] && root_umount "$wheel_root"
  return 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  self=$(readlink -f "$0")
  [ -z "${DMAGATHER_WHEEL:-}" ] || DMAGATHER_WHEEL=$(readlink -f "$DMAGATHER_WHEEL")
  cd "$(dirname "$self")/../.." || exit 2
  [ "$(id -u)" -eq 0 ] || { echo "wheel: SKIPPED: needs root (chroot)"; echo "0 passed, 0 failed, 1 skipped"; exit 77; }
  if [ -z "${DMAGATHER_IN_PRIVATE_NS:-}" ]; then
    DMAGATHER_IN_PRIVATE_NS=1 DMAGATHER_WHEEL=${DMAGATHER_WHEEL:-} exec unshare --mount --propagation private "$self" "$@"
  fi
  for t in debootstrap zstd; do
    command -v "$t" >/dev/null || { echo "wheel: $t missing: run tools/install_deps.sh"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
  done
  . packaging/debian12_root.sh
  name=wheel
  . tests/packaging/cases.sh
  work_new dmagather-wheeltest 2 4
  pids=()
  cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    wheel_cleanup
    work_remove
  }
  trap cleanup EXIT
  t_case=$SECONDS
  wheel_cases
  if [ "$wheel_unavailable" = 1 ]; then
    echo "$name: $((SECONDS)) s in all"
    echo "$passed passed, $failed failed, $skipped skipped"
    exit 77
  fi
  finish
fi

#!/usr/bin/env bash
# The packages on a clean Debian 12 root, the DaemonSet's image, and the wheel
# on a clean Debian 12 root (docs/TESTING.md "Packages"). Needs root (debootstrap, chroot, mounts in a
# private mount namespace) and the Debian mirror (the first run, and the
# packages' dependencies until they are in the apt cache).
#
#   tests/packaging/run.sh            ends with `N passed, N failed, N skipped`
#   tests/packaging/run.sh upgrade    only the upgrade under a running job on a
#                                     booted systemd (tests/packaging/upgrade.sh:
#                                     its own cases and counts; about a minute,
#                                     so not part of the default run)
#   tests/packaging/run.sh wheel      only the wheel's cases (tests/packaging/wheel.sh)
#
# Cases, each on real data:
#   build_debs      tools/build_debs.sh makes the four packages
#   install         apt-get install of the .debs into a clean root (debootstrap
#                   minbase + gcc, pkg-config, python3, Debian's python3-torch;
#                   cached as a tarball under ~/.cache/dmagather): dependencies
#                   resolve from Debian, the maintainer scripts make the group,
#                   enable the unit and start nothing (it is a chroot)
#   depends         every shared library the installed binaries load comes from
#                   a package named in that package's Depends
#   pkg_config      cc allgather_check.c $(pkg-config --cflags --libs dmagather)
#                   inside the root; --modversion is the library's version
#   unit_start      dmagatherd started as the installed unit says (EnvironmentFile,
#                   RuntimeDirectory, ExecStart, Type=notify READY=1);
#                   dmagatherctl health says SERVING
#   c_allgather     the program: 4 ranks, 8 dtypes x 4 sizes, in place and out
#                   of place, every output byte compared
#   python_check    python3 -m dmagather.check --world 4 with no environment
#                   variable: the installed package loads the installed library
#                   (by SONAME), bfloat16/float16/float32 PASSED
#   unit_stop       SIGTERM: the daemon exits and removes its sockets
#   purge           apt-get purge removes every installed file
#   image           tools/build_image.sh; the image unpacked (umoci) holds a
#                   daemon that starts with the DaemonSet's arguments and serves
#                   the root's C program (4 ranks, bit-exact) through its socket
#   build_wheel, wheel_venv, wheel_daemon, wheel_python
#                   tests/packaging/wheel.sh (sourced): the wheel in a venv on
#                   another clean root (minbase + python3-venv only), its
#                   daemon (nothing mapped from outside the wheel but the C/C++
#                   runtime), 3 ranks' all-gather and reduce-scatter from Python
#                   without numpy or torch, bit-exact
# The wheel's service command and python -m dmagather.check against its daemon
# are tests/trainers/wheel_test.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
[ "${1:-}" != upgrade ] || exec tests/packaging/upgrade.sh
[ "${1:-}" != wheel ] || exec tests/packaging/wheel.sh
[ "$(id -u)" -eq 0 ] || { echo "packaging: SKIPPED: needs root (debootstrap, chroot)"; echo "0 passed, 0 failed, 1 skipped"; exit 77; }
if [ -z "${DMAGATHER_IN_PRIVATE_NS:-}" ]; then
  DMAGATHER_IN_PRIVATE_NS=1 exec unshare --mount --propagation private "$0" "$@"
fi
for t in debootstrap umoci zstd dpkg-shlibdeps; do
  command -v "$t" >/dev/null || { echo "packaging: $t missing: run tools/install_deps.sh"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
done
. packaging/debian12_root.sh

name=packaging
. tests/packaging/cases.sh
. tests/packaging/wheel.sh
work_new dmagather-pkgtest 6 10  # The roots: 2 GB with torch.
root=$work/root
rootfs=$work/bundle/rootfs
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  root_umount "$root"
  for m in "$root/run/image-socket" "$rootfs/proc" "$rootfs/dev/shm"; do mountpoint -q "$m" && umount -l "$m"; done
  wheel_cleanup
  work_remove
}
trap cleanup EXIT
t_case=$SECONDS
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
# Processes whose root is DIR (started in that chroot).
procs_in() {
  local dir p
  dir=$(readlink -f "$1")
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$dir" ] && echo "${p#/proc/} $(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)"
  done
}

# --- build_debs -----------------------------------------------------------------
echo "== build_debs"
if tools/build_debs.sh "$work/debs" >"$work/build_debs.log" 2>&1 && [ "$(ls "$work"/debs/*.deb | wc -l)" -eq 4 ]; then
  for f in "$work"/debs/*.deb; do echo "  $(basename "$f") $(stat -c %s "$f") bytes"; done
  ok build_debs
else
  tail -20 "$work/build_debs.log"
  bad build_debs "tools/build_debs.sh failed"
  finish
fi
version=$(dpkg-deb -f "$work"/debs/libdmagather0_*.deb Version)
upstream=${version%-*}

# --- install --------------------------------------------------------------------
echo "== install"
t0=$SECONDS
tarball=$(root_tarball test gcc libc6-dev pkg-config python3 python3-torch) || { bad install "no Debian 12 root"; finish; }
t_root=$((SECONDS - t0))
root_unpack "$tarball" "$root"
root_mount "$root"
echo "  root: $(basename "$tarball") ready in $t_root s, unpacked in $((SECONDS - t0 - t_root)) s"
mkdir -p "$root/tmp/debs" && cp "$work"/debs/*.deb "$root/tmp/debs/"
debs_in_root=$(cd "$root" && ls tmp/debs/*.deb | sed 's|^|/|')
# As in a chroot on a booted systemd host whose /run is shared: the scripts
# must tell the chroot by themselves. A systemctl that records its calls.
mkdir -p "$root/run/systemd/system"
printf '#!/bin/sh\necho "$*" >>/tmp/systemctl.calls\n' >"$root/usr/bin/systemctl"
chmod 0755 "$root/usr/bin/systemctl"
if ! root_apt "$root" install $debs_in_root >"$work/install.log" 2>&1; then
  tail -30 "$work/install.log"
  bad install "apt-get install of the packages failed"
  finish
fi
why=""
for p in dmagatherd libdmagather0 libdmagather-dev python3-dmagather; do
  grep -q "install ok installed" <<<"$(in_root dpkg-query -W -f='${Status}\n' "$p" 2>&1)" || why+="$p not installed; "
done
in_root getent group dmagather >/dev/null || why+="no group dmagather; "
# Enabled: the link, or (with a systemctl present, as here) deb-systemd-helper's
# `systemctl preset` on first install.
[ -L "$root/etc/systemd/system/multi-user.target.wants/dmagatherd.service" ] ||
  grep -q " preset dmagatherd.service$" "$root/tmp/systemctl.calls" 2>/dev/null || why+="unit not enabled; "
[ -f "$root/etc/dmagather/dmagatherd.conf" ] || why+="no /etc/dmagather/dmagatherd.conf; "
running=$(procs_in "$root")
[ -z "$running" ] || why+="the install started processes in the chroot: $running; "
# (deb-systemd-helper itself may run `systemctl daemon-reload`; starting is ours to avoid.)
echo "  systemctl calls during the install: $(tr '\n' ';' <"$root/tmp/systemctl.calls" 2>/dev/null)"
calls=$(grep -E '(^| )(start|restart|try-restart|reload-or-restart)( |$)' "$root/tmp/systemctl.calls" 2>/dev/null)
[ -z "$calls" ] || why+="the maintainer scripts called systemctl in a chroot: $calls; "
rm -rf "$root/usr/bin/systemctl" "$root/run/systemd" "$root/tmp/systemctl.calls"
echo "  pulled from Debian: $(grep -cE '^(Get|Unpacking) ' "$work/install.log") lines of apt output; $(grep -c '^Setting up' "$work/install.log") packages set up"
if [ -z "$why" ]; then ok install; else bad install "$why"; fi

# --- depends --------------------------------------------------------------------
echo "== depends"
why=""
check_depends() {  # PACKAGE FILE...: everything resolves; each NEEDED library is this package's or a Depends'
  local pkg=$1 f name re path owner deps map
  shift
  deps=$(in_root dpkg-query -W -f='${Depends}' "$pkg" | tr ',|' '\n\n' | sed -E 's/\(.*\)//; s/:any//; s/ //g')
  for f in "$@"; do
    map=$(in_root ldd "$f")
    if grep -q "not found" <<<"$map"; then why+="$f: $(grep "not found" <<<"$map" | tr -s ' \n' ' '); "; fi
    for name in $(readelf -d "$root$f" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p'); do
      re=$(sed 's/[.+]/\\&/g' <<<"$name")
      path=$(sed -nE "s|^\s*$re => (/[^ ]+).*|\1|p; s|^\s*(/[^ ]*/$re) \(.*|\1|p" <<<"$map" | head -1)
      [ -n "$path" ] || { why+="$f: $name unresolved; "; continue; }
      owner=$(in_root dpkg-query -S "$(in_root readlink -f "$path")" 2>/dev/null | head -1 | cut -d: -f1)
      [ -n "$owner" ] || owner=$(in_root dpkg-query -S "$path" 2>/dev/null | head -1 | cut -d: -f1)
      [ -n "$owner" ] || owner=$(in_root dpkg-query -S "*/$name" 2>/dev/null | head -1 | cut -d: -f1)
      [ "$owner" = "$pkg" ] && continue
      grep -qx "$owner" <<<"$deps" || why+="$pkg: $f needs $name ($owner), not in Depends; "
    done
  done
}
check_depends dmagatherd /usr/bin/dmagatherd /usr/bin/dmagatherctl
libpath=$(in_root sh -c 'ls /usr/lib/*/libdmagather.so.0')
check_depends libdmagather0 "$libpath"
echo "  libdmagather0: $libpath -> $(readlink "$root$libpath"); SONAME $(readelf -d "$root$libpath" | sed -nE 's/.*\(SONAME\).*\[(.*)\]/\1/p')"
if [ -z "$why" ]; then ok depends; else bad depends "$why"; fi

# --- pkg_config -----------------------------------------------------------------
echo "== pkg_config"
cp tests/packaging/allgather_check.c tests/packaging/unit_start.py "$root/tmp/"
modv=$(in_root pkg-config --modversion dmagather 2>&1)
flags=$(in_root pkg-config --cflags --libs dmagather 2>&1)
echo "  pkg-config --cflags --libs dmagather: $flags"
if [ "$modv" = "$upstream" ] &&
   in_root sh -c 'cc -O2 -Wall -o /tmp/allgather_check /tmp/allgather_check.c $(pkg-config --cflags --libs dmagather)' \
     >"$work/cc.log" 2>&1 &&
   grep -qE "libdmagather.so.0 => /(usr/)?lib/" <<<"$(in_root ldd /tmp/allgather_check 2>&1)"; then
  ok pkg_config
else
  cat "$work/cc.log"
  in_root ldd /tmp/allgather_check 2>&1 | sed 's/^/  ldd: /'
  bad pkg_config "modversion '$modv' (want $upstream) or the compile failed"
fi

# --- unit_start -----------------------------------------------------------------
echo "== unit_start"
# As an operator would: the metrics endpoint on any free port (this chroot
# shares the host's network).
sed -i 's|^DMAGATHERD_ARGS="\(.*\)"$|DMAGATHERD_ARGS="\1 --metrics_listen=127.0.0.1:0"|' "$root/etc/dmagather/dmagatherd.conf"
daemon_pid=""
start_out=$(in_root python3 /tmp/unit_start.py /lib/systemd/system/dmagatherd.service /tmp/dmagatherd.log 60 2>&1)
echo "$start_out" | sed 's/^/  /' | tail -5
daemon_pid=$(sed -nE 's/^pid ([0-9]+)$/\1/p' <<<"$start_out")
health=""
if [ -n "$daemon_pid" ]; then
  pids+=("$daemon_pid")
  health=$(in_root dmagatherctl health 2>&1)
  echo "$health" | sed 's/^/  /' | head -5
fi
if [ -n "$daemon_pid" ] && grep -q SERVING <<<"$health" && [ -S "$root/run/dmagather/dmagatherd.sock" ]; then
  ok unit_start
else
  bad unit_start "daemon not started from the unit, or not SERVING"
fi

# --- c_allgather ----------------------------------------------------------------
echo "== c_allgather"
if [ -n "$daemon_pid" ] && [ -x "$root/tmp/allgather_check" ] &&
   in_root /tmp/allgather_check 4 "$upstream" >"$work/c.log" 2>&1 && grep -q "^PASSED: 4 ranks, 0 failed" "$work/c.log"; then
  sed 's/^/  /' "$work/c.log"
  ok c_allgather
else
  sed 's/^/  /' "$work/c.log" 2>/dev/null
  bad c_allgather "the installed library's all-gather across 4 processes was not bit-exact (or did not run)"
fi

# --- python_check ---------------------------------------------------------------
echo "== python_check"
probe=$(in_root python3 -c 'import dmagather; l = dmagather.load_library(); print(dmagather.__file__, l._name, dmagather.library_version())' 2>&1)
echo "  $probe"
if ! in_root python3 -c 'import torch' 2>/dev/null; then
  skip python_check "the root's python3 has no torch (the C program ran the check)"
elif [ -n "$daemon_pid" ] &&
     in_root python3 -m dmagather.check --world 4 --sizes 65536,1048576 --iters 3 --warmup 1 >"$work/py.log" 2>&1 &&
     grep -q "^backend: host (dmagather $upstream, 4 ranks" "$work/py.log" &&
     [ "$(grep -cE '^(bfloat16|float16|float32) PASSED$' "$work/py.log")" -eq 3 ] &&
     grep -q "^/usr/lib/python3/dist-packages/dmagather/__init__.py libdmagather.so.0 $upstream$" <<<"$probe"; then
  sed 's/^/  /' "$work/py.log"
  ok python_check
else
  sed 's/^/  /' "$work/py.log" 2>/dev/null | tail -20
  bad python_check "python3 -m dmagather.check from the installed package failed"
fi

# --- unit_stop ------------------------------------------------------------------
echo "== unit_stop"
if [ -n "$daemon_pid" ]; then
  kill -TERM "$daemon_pid"
  for _ in $(seq 1 300); do [ -d "/proc/$daemon_pid" ] || break; sleep 0.1; done
  if [ ! -d "/proc/$daemon_pid" ] && [ ! -e "$root/run/dmagather/dmagatherd.sock" ] &&
     [ ! -e "$root/run/dmagather/dmagatherd.sock.fd" ]; then
    ok unit_stop
  else
    bad unit_stop "still running or sockets left: $(ls "$root/run/dmagather")"
  fi
else
  bad unit_stop "no daemon"
fi

# --- purge ----------------------------------------------------------------------
echo "== purge"
files=$(in_root dpkg-query -L dmagatherd libdmagather0 libdmagather-dev python3-dmagather |
        while read -r f; do [ ! -d "$root$f" ] && { [ -f "$root$f" ] || [ -L "$root$f" ]; } && echo "$f"; done)
if root_apt "$root" purge dmagatherd libdmagather0 libdmagather-dev python3-dmagather >"$work/purge.log" 2>&1; then
  left=$(while read -r f; do [ -e "$root$f" ] || [ -L "$root$f" ] && echo "$f"; done <<<"$files")
  [ -e "$root/etc/dmagather" ] && left+=" /etc/dmagather"
  if [ -z "$left" ]; then ok purge; else bad purge "left behind: $left"; fi
else
  tail -20 "$work/purge.log"
  bad purge "apt-get purge failed"
fi

# --- image ----------------------------------------------------------------------
echo "== image"
t0=$SECONDS
if DMAGATHER_DEBS=$work/debs TMPDIR=$work tools/build_image.sh "$work/image" >"$work/image.log" 2>&1; then
  ref=$(sed -n 's/^image: //p' "$work/image.log")
  echo "  built $ref in $((SECONDS - t0)) s: $(grep '^image layers' "$work/image.log")"
  why=""
  umoci unpack --image "$ref" "$work/bundle" >/dev/null 2>&1 || why+="umoci unpack failed; "
  cfg=$(cat "$work/bundle/config.json" 2>/dev/null)
  grep -q '"/usr/bin/dmagatherd"' <<<"$cfg" || why+="entrypoint is not /usr/bin/dmagatherd; "
  if [ -z "$why" ]; then
    mkdir -p "$rootfs/proc" "$rootfs/dev/shm"
    mount -t proc proc "$rootfs/proc" && mount -t tmpfs -o mode=1777 tmpfs "$rootfs/dev/shm"
    # The DaemonSet's arguments (deploy/k8s/daemonset.yaml), metrics on any free port.
    chroot "$rootfs" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin /usr/bin/dmagatherd \
      --socket=/run/dmagather/dmagatherd.sock --backend=auto --socket_mode=0666 --metrics_listen=127.0.0.1:0 \
      >"$work/image-daemon.log" 2>&1 &
    ipid=$!
    pids+=("$ipid")
    for _ in $(seq 1 300); do [ -S "$rootfs/run/dmagather/dmagatherd.sock.fd" ] && break; sleep 0.1; done
    ih=$(chroot "$rootfs" /usr/bin/dmagatherctl --socket=/run/dmagather/dmagatherd.sock health 2>&1)
    echo "$ih" | sed 's/^/  /' | head -3
    grep -q SERVING <<<"$ih" || why+="dmagatherctl health in the image: not SERVING; "
    # Ranks in another root (the test root), as training pods: the socket directory shared.
    mkdir -p "$root/run/image-socket"
    mount --bind "$rootfs/run/dmagather" "$root/run/image-socket"
    if [ -x "$root/tmp/allgather_check" ]; then
      # The library was purged above: reinstall it (from the apt cache) for the ranks.
      root_apt "$root" install "/tmp/debs/$(basename "$work"/debs/libdmagather0_*.deb)" >"$work/reinstall.log" 2>&1
      if chroot "$root" env -i PATH=/usr/bin:/bin DMAGATHER_SOCKET=/run/image-socket/dmagatherd.sock \
           /tmp/allgather_check 4 >"$work/image-c.log" 2>&1 && grep -q "^PASSED: 4 ranks, 0 failed" "$work/image-c.log"; then
        sed 's/^/  /' "$work/image-c.log" | tail -2
      else
        sed 's/^/  /' "$work/image-c.log" | tail -5
        why+="ranks outside the image: all-gather through the image's daemon failed; "
      fi
    fi
    kill -TERM "$ipid"
    wait "$ipid"
    irc=$?
    [ "$irc" -eq 0 ] || why+="the image's daemon exited $irc at SIGTERM; "
    echo "  OCI layout: $(du -sh "$work/image/dmagatherd" | cut -f1), tar $(stat -c %s "$work"/image/*.oci.tar) bytes, root $(du -sh "$rootfs" 2>/dev/null | cut -f1)"
  fi
  if [ -z "$why" ]; then ok image; else tail -5 "$work/image-daemon.log" 2>/dev/null; bad image "$why"; fi
else
  tail -20 "$work/image.log"
  bad image "tools/build_image.sh failed"
fi

# --- build_wheel, wheel_venv, wheel_daemon, wheel_python (tests/packaging/wheel.sh)
wheel_cases

finish

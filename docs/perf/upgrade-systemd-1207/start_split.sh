#!/bin/bash
# Where the new daemon's start under systemd goes: the unit as shipped against
# the unit with its sandbox turned off in a drop-in (8 `systemctl restart`s
# each, alternated twice; no job), and the daemon started by hand in the same
# root. The root is booted as tests/packaging/upgrade.sh boots it (its --pid1
# mode, the same masks and cgroup of the run). Needs root.
#
#   docs/perf/upgrade-systemd-1207/start_split.sh DEBS_DIR   (the four .debs of one revision)
set -uo pipefail
[ -n "${INNS:-}" ] || INNS=1 exec unshare --mount --propagation private "$0" "$@"
repo=$(cd "$(dirname "$0")/../../.." && pwd)
debs=$(cd "$1" && pwd)
. $repo/packaging/debian12_root.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/sdsplit.XXXXXX"); mount -t tmpfs -o size=2g tmpfs $work
root=$work/root
root_unpack $(root_tarball systemd systemd systemd-sysv dbus gcc libc6-dev pkg-config python3) $root
mkdir -p $root/var/cache/apt/archives; mount --bind $root_cache/apt-archives $root/var/cache/apt/archives
for u in getty@.service serial-getty@.service console-getty.service container-getty@.service getty-static.service \
         systemd-sysctl.service systemd-binfmt.service proc-sys-fs-binfmt_misc.automount \
         proc-sys-fs-binfmt_misc.mount systemd-remount-fs.service systemd-modules-load.service \
         kmod-static-nodes.service systemd-pstore.service systemd-firstboot.service sys-kernel-debug.mount \
         sys-kernel-tracing.mount sys-kernel-config.mount sys-fs-fuse-connections.mount dev-hugepages.mount \
         dev-mqueue.mount systemd-journald-audit.socket apt-daily.timer apt-daily-upgrade.timer \
         dpkg-db-backup.timer e2scrub_all.timer fstrim.timer; do ln -sf /dev/null "$root/etc/systemd/system/$u"; done
cgname=sdsplit.$$; cgpath=$(awk -F: '{ if (length($3) > length(p)) p = $3 } END { print p }' /proc/self/cgroup)/$cgname
mounts=(); tops=()
mkdir -p $work/.cg
while IFS=: read -r id ctrl path; do
  m=$work/.cg/$id; mkdir -p $m
  if [ -z "$ctrl" ]; then mount -t cgroup2 cgroup2 $m; elif [[ $ctrl == name=* ]]; then mount -t cgroup -o none,$ctrl cgroup $m; else mount -t cgroup -o $ctrl cgroup $m; fi
  mounts+=($m); top=$m$cgpath; while [ ! -d "${top%/*}" ]; do top=${top%/*}; done; tops+=($top)
  mkdir -p $m$cgpath
  for f in cpuset.cpus cpuset.mems; do [ -f $m$cgpath/$f ] || continue; d=$m${path%/}; for part in $(tr / ' ' <<<"${cgpath#"${path%/}"/}"); do [ -n "$(cat $d/$part/$f)" ] || cat $d/$f > $d/$part/$f; d=$d/$part; done; done
done < <(cat /proc/self/cgroup)
( for m in "${mounts[@]}"; do echo $BASHPID > $m$cgpath/cgroup.procs; done
  exec unshare --pid --fork --mount --propagation private --uts --net $repo/tests/packaging/upgrade.sh --pid1 $root ) > $work/pid1.log 2>&1 &
outer=$!
cleanup() {
  [ -n "${sd:-}" ] && kill -KILL $sd; wait $outer 2>/dev/null
  for t in "${tops[@]}"; do for _ in $(seq 1 50); do find $t -depth -type d -exec rmdir {} + 2>/dev/null; [ -d $t ] || break; sleep 0.1; done; [ -d $t ] && echo "left $t"; done
  for m in "${mounts[@]}"; do umount -l $m; done
  umount -l $root/var/cache/apt/archives; umount -l $work; rmdir $work
}
trap cleanup EXIT
for _ in $(seq 1 100); do sd=$(awk '{print $1}' /proc/$outer/task/$outer/children 2>/dev/null); [ -n "$sd" ] && [ "$(cat /proc/$sd/comm)" = systemd ] && break; sleep 0.1; done
in_sd() { nsenter -t "$sd" -m -u -p -r -w env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
for _ in $(seq 1 100); do in_sd test -S /run/systemd/private && break; sleep 0.1; done
in_sd systemctl is-system-running --wait
mkdir -p $root/tmp/debs; cp "$debs"/*.deb $root/tmp/debs/
in_sd env DEBIAN_FRONTEND=noninteractive apt-get -y -q -o APT::Install-Recommends=false install $(cd $root && ls tmp/debs/*.deb | sed 's|^|/|') > $work/install.log 2>&1 || { tail -20 $work/install.log; exit 1; }
in_sd systemctl is-active dmagatherd.service
measure() {  # LABEL: 8 restarts 2.1 s apart (systemd's start limit: 5 in 10 s): Stopped -> Starting, Starting -> serving line, Starting -> Started
  in_sd journalctl --rotate >/dev/null 2>&1; local since=$(in_sd date +%s.%N)
  for i in $(seq 1 8); do in_sd systemctl reset-failed dmagatherd.service; in_sd systemctl restart dmagatherd.service; sleep 2.1; done
  in_sd journalctl -u dmagatherd -o short-unix --no-pager --since "@${since%.*}" | awk -v L="$1" '
    /Stopped dmagatherd.service/ { st = $1 } /Starting dmagatherd.service/ { s = $1; if (st) a[++na] = (s - st) * 1000 }
    /serving on/ && s { b[++nb] = ($1 - s) * 1000 } /Started dmagatherd.service/ && s { c[++nc] = ($1 - s) * 1000; s = 0 }
    function med(x, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t } return x[int((n + 1) / 2)] }
    END { printf "%s: Stopped->Starting p50 %.0f ms (n=%d); Starting->serving line p50 %.0f ms (n=%d); Starting->Started p50 %.0f ms (n=%d)\n", L, med(a, na), na, med(b, nb), nb, med(c, nc), nc }'
}
measure "as shipped"
mkdir -p $root/etc/systemd/system/dmagatherd.service.d
cat > $root/etc/systemd/system/dmagatherd.service.d/nosandbox.conf <<'C'
[Service]
NoNewPrivileges=no
ProtectSystem=no
ProtectHome=no
PrivateTmp=no
RestrictAddressFamilies=
LockPersonality=no
SystemCallArchitectures=
ProtectKernelTunables=no
ProtectKernelModules=no
ProtectKernelLogs=no
ProtectControlGroups=no
ProtectClock=no
ProtectHostname=no
RestrictRealtime=no
RestrictSUIDSGID=no
RestrictNamespaces=no
C
cp $root/etc/systemd/system/dmagatherd.service.d/nosandbox.conf $work/
in_sd systemctl daemon-reload
measure "no sandbox (drop-in)"
rm -rf $root/etc/systemd/system/dmagatherd.service.d; in_sd systemctl daemon-reload
measure "as shipped again"
mkdir -p $root/etc/systemd/system/dmagatherd.service.d; cp $work/nosandbox.conf $root/etc/systemd/system/dmagatherd.service.d/; in_sd systemctl daemon-reload
measure "no sandbox again"
rm -rf $root/etc/systemd/system/dmagatherd.service.d; in_sd systemctl daemon-reload
# By hand in the root (no systemd): exec to the daemon's own "serving on" timestamp.
in_sd systemctl stop dmagatherd.service
for i in 1 2 3 4 5 6 7 8; do
  in_sd sh -c 'mkdir -p /run/dmagather; t0=$(date +%s.%N); /usr/bin/dmagatherd --socket=/run/dmagather/dmagatherd.sock --backend=auto --op_timeout_s=300 --log_level=info > /tmp/d.log 2>&1 & p=$!; for k in $(seq 1 500); do grep -q "serving on" /tmp/d.log && break; sleep 0.02; done; kill -TERM $p; wait $p; t1=$(grep "serving on" /tmp/d.log | awk "{print \$2}"); awk -v a=$t0 -v b="$t1" "BEGIN { split(b, x, \":\"); printf \"by hand: exec -> serving %.0f ms\\n\", (x[1] * 3600 + x[2] * 60 + x[3] - (a % 86400)) * 1000 }"'
done
uptime

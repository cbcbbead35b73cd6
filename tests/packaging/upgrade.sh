#!/usr/bin/env bash
# A package upgrade and a `systemctl restart` under a running job, on a real
# systemd (docs/TESTING.md "Packages", docs/OPERATIONS.md "Upgrades"). Run by
# `tests/packaging/run.sh upgrade`; needs root and the Debian mirror (the first
# run), as run.sh.
#
#   tests/packaging/upgrade.sh        ends with `N passed, N failed, N skipped`
#
# A clean Debian 12 root (debootstrap minbase + systemd, dbus, gcc, pkg-config,
# python3; cached as run.sh's roots are) boots Debian's systemd as PID 1 of its
# own PID, mount, UTS and network namespaces (the network one has only its
# loopback: the daemon's metrics port is its own): the root is chrooted into,
# with a fresh /proc (its /proc/sys read-only), a read-only /sys and a /dev of
# its own (a tmpfs with the basic character devices); systemd starts in a cgroup of this
# run (one path in every hierarchy), takes it as its root, and everything it
# makes there is removed at the end. The units that would change the
# machine rather than the root (sysctl, binfmt, remount of /, kernel modules,
# pstore, debugfs/tracefs/configfs/fuse/hugetlbfs/mqueue mounts, audit, gettys)
# and the apt/dpkg timers are masked. No container= variable is set: systemd,
# systemd-detect-virt and the maintainer scripts see a booted host, so dpkg's
# postinst starts and restarts dmagatherd through systemctl as on a real node.
# Commands run in the booted root through nsenter: its PID, mount and UTS
# namespaces and its root; the network namespace is the machine's (apt reaches
# the mirror where the cache lacks a dependency).
#
# Cases, each on real data:
#   build_debs     tools/build_debs.sh twice: revision 1 (old) and 2 (new)
#                  (DMAGATHER_DEB_REVISION), the same sources
#   boot           systemd as PID 1: `systemctl is-system-running --wait` says
#                  running (or degraded: the failed units are printed);
#                  `systemd-detect-virt --container` says none. Where it cannot
#                  boot here, this and the cases after it are SKIPPED (exit 77)
#   install        apt-get install of the old .debs: the postinst starts the
#                  unit (Type=notify, as shipped); `systemctl start` is then a
#                  no-op; dmagatherctl health SERVING
#   job            restart_job.c built in the root against the installed
#                  library: 4 ranks, numbered ops, each with its own inputs,
#                  paced (DMAGATHER_UPGRADE_PACE_US, default 2000 us)
#   restart        `systemctl restart dmagatherd` under the job (each restart
#                  2.2 s or more after the unit's previous start: systemd's
#                  start limit counts restarts): a new MainPID, dmagatherctl
#                  stats on it: `restarts: 1 jobs taken back` (4 ranks), the
#                  job goes on
#   upgrade        apt-get install of the new .debs under the job: the
#                  postinst's deb-systemd-invoke restarts the unit; dpkg -s says
#                  the new version; a new MainPID running the new file; stats
#                  as above
#   job_end        the job stops at an op number given once both are done: every
#                  rank ran ops 0..N-1, each once (op handles 1..N in order),
#                  DMAGATHER_OK, 0 bytes differing; each rank logged one wait
#                  line and one back line per restart; the journal has the new
#                  daemon's `taken back ... going on after op M` after each;
#                  the gap of each (a rank's wait for op M returning to its
#                  wait for op M+1 returning, max over the ranks) is printed
#                  with the journal's split of it
# DMAGATHER_UPGRADE_ROUNDS=N (default 1) repeats restart and upgrade N times
# (revisions 1..N+1); DMAGATHER_UPGRADE_CSV=FILE appends one line per restart
# (kind,round,gap_ms,...) for docs/perf; DMAGATHER_KEEP_LOGS=1 keeps the work
# directory (the ranks' CSVs, the journal).
set -uo pipefail

# --- PID 1 of the booted root (run by unshare below) ----------------------------
if [ "${1:-}" = --pid1 ]; then
  r=$2
  [ $$ -eq 1 ] || { echo "upgrade: --pid1 is not PID 1" >&2; exit 1; }
  set -e
  # Recursive: the apt cache bound into the root stays.
  mount --rbind "$r" "$r"
  mount -t proc proc "$r/proc"
  mount --bind "$r/proc/sys" "$r/proc/sys"
  mount -o remount,bind,ro "$r/proc/sys"
  mount -t sysfs -o ro sysfs "$r/sys"
  mount -t tmpfs -o mode=0755,size=64m tmpfs "$r/dev"
  for n in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
    IFS=: read -r name major minor <<<"$n"
    mknod -m 0666 "$r/dev/$name" c "$major" "$minor"
  done
  mkdir -p "$r/dev/pts" "$r/dev/shm"
  mount -t devpts -o newinstance,ptmxmode=0666 devpts "$r/dev/pts"
  ln -s pts/ptmx "$r/dev/ptmx"
  mount -t tmpfs -o mode=1777 tmpfs "$r/dev/shm"
  exec chroot "$r" /lib/systemd/systemd --log-level=info
fi

cd "$(dirname "$0")/../.."
repo=$PWD
[ "$(id -u)" -eq 0 ] || { echo "upgrade: SKIPPED: needs root (chroot, namespaces)"; echo "0 passed, 0 failed, 1 skipped"; exit 77; }
if [ -z "${DMAGATHER_IN_PRIVATE_NS:-}" ]; then
  DMAGATHER_IN_PRIVATE_NS=1 exec unshare --mount --propagation private "$0" "$@"
fi
for t in debootstrap zstd dpkg-shlibdeps nsenter unshare; do
  command -v "$t" >/dev/null || { echo "upgrade: $t missing: run tools/install_deps.sh"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
done
. packaging/debian12_root.sh

rounds=${DMAGATHER_UPGRADE_ROUNDS:-1}
pace_us=${DMAGATHER_UPGRADE_PACE_US:-2000}
world=4
name=upgrade
. tests/packaging/cases.sh
work_new dmagather-upgrade 2 4
root=$work/root
cgname=dmagather-upgrade.$$
cgdirs=() cgmounts=()
sd_outer=""  # unshare's PID (outside); PID 1 of the root is its child
sd=""        # systemd's PID as this namespace sees it
job_pid=""

cleanup() {
  [ -n "$job_pid" ] && kill -KILL "$job_pid" 2>/dev/null
  # SIGKILL to the namespace's PID 1 ends every process in it (systemd's
  # shutdown, which would also touch the machine's devices, never runs).
  [ -n "$sd" ] || [ -z "$sd_outer" ] || sd=$(cat "/proc/$sd_outer/task/$sd_outer/children" 2>/dev/null | awk '{print $1}')
  [ -n "$sd" ] && kill -KILL "$sd" 2>/dev/null
  [ -n "$sd_outer" ] && wait "$sd_outer" 2>/dev/null
  local d m
  for d in "${cgdirs[@]}"; do
    for _ in $(seq 1 50); do
      find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
      [ -d "$d" ] || break
      sleep 0.1
    done
    [ -d "$d" ] && echo "upgrade: cgroup $d left behind"
  done
  for m in "${cgmounts[@]}"; do umount -l "$m"; done
  root_umount "$root"
  work_remove
}
trap cleanup EXIT
t_case=$SECONDS
# Where systemd cannot boot here (no PID namespace, a kernel or a container
# that refuses its mounts), nothing of the packages was tried: the boot and
# the cases after it are skipped, with the reason, and the exit status is 77.
skip_rest() {
  echo "SKIPPED boot: $1"
  skipped=$((skipped + 6))
  echo "  (install, job, restart, upgrade, job_end not run)"
  echo "upgrade: $((SECONDS)) s in all"
  echo "$passed passed, $failed failed, $skipped skipped"
  exit 77
}
now_ns() { date +%s%N; }
# A command in the booted root: its namespaces, its root, a clean environment.
in_sd() {
  nsenter -t "$sd" -m -u -p -r -w env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"
}
sd_apt() {
  in_sd env DEBIAN_FRONTEND=noninteractive apt-get -y -q -o APT::Install-Recommends=false -o Dpkg::Use-Pty=0 \
    -o APT::Keep-Downloaded-Packages=true "$@"
}
main_pid() { in_sd systemctl show -p MainPID --value dmagatherd.service; }
# Ops every rank has finished (the fewest lines among the ranks' CSVs).
ops_done() {
  local r n min=""
  for r in $(seq 0 $((world - 1))); do
    n=$(($({ wc -l <"$root/tmp/job/rank$r.csv"; } 2>/dev/null || echo 1) - 1))
    [ -z "$min" ] || [ "$n" -lt "$min" ] && min=$n
  done
  echo "${min:-0}"
}
# Waits until every rank finished N ops; fails when the job ended first.
wait_ops() {
  local n=$1 deadline=$((SECONDS + 120))
  while [ "$(ops_done)" -lt "$n" ]; do
    kill -0 "$job_pid" 2>/dev/null || { echo "  the job ended at op $(ops_done) (waiting for $n)"; return 1; }
    [ "$SECONDS" -lt "$deadline" ] || { echo "  the job is at op $(ops_done) after 120 s (waiting for $n)"; return 1; }
    sleep 0.2
  done
}
# The restart a new MainPID must show: a process running the installed file.
check_daemon() {  # OLD_PID: prints why not, nothing when fine
  local old=$1 pid exe
  pid=$(main_pid)
  [ -n "$pid" ] && [ "$pid" != 0 ] || { echo "no MainPID; "; return; }
  [ "$pid" != "$old" ] || echo "MainPID still $old; "
  # The file it runs is the one installed now (dpkg puts a new inode in place).
  exe=$(in_sd stat -Lc %i "/proc/$pid/exe")
  [ "$exe" = "$(in_sd stat -Lc %i /usr/bin/dmagatherd)" ] ||
    echo "MainPID $pid runs inode $exe, not the installed /usr/bin/dmagatherd; "
  [ "$(in_sd systemctl is-active dmagatherd.service)" = active ] || echo "unit not active; "
}
# The stats line of the running daemon about jobs it took back.
restarts_line() { in_sd dmagatherctl stats 2>&1 | grep '^restarts:'; }
events=()  # kind round t_start_ns t_end_ns

# --- build_debs -----------------------------------------------------------------
echo "== build_debs"
why=""
for rev in $(seq 1 $((rounds + 1))); do
  if DMAGATHER_DEB_REVISION=$rev tools/build_debs.sh "$work/debs-$rev" >"$work/build_debs-$rev.log" 2>&1 &&
     [ "$(ls "$work/debs-$rev"/*.deb | wc -l)" -eq 4 ]; then
    echo "  revision $rev: $(cd "$work/debs-$rev" && ls dmagatherd_*.deb)"
  else
    tail -20 "$work/build_debs-$rev.log"
    why+="tools/build_debs.sh failed for revision $rev; "
    break
  fi
done
if [ -z "$why" ]; then ok build_debs; else bad build_debs "$why"; finish; fi
version_of() { dpkg-deb -f "$work/debs-$1"/dmagatherd_*.deb Version; }
# The .debs of revision REV as the booted root sees them.
debs_of() { (cd "$root" && ls tmp/debs/"$1"/*.deb | sed 's|^|/|'); }

# --- boot -----------------------------------------------------------------------
echo "== boot"
t0=$SECONDS
tarball=$(root_tarball systemd systemd systemd-sysv dbus gcc libc6-dev pkg-config python3) ||
  { bad boot "no Debian 12 root"; finish; }
root_unpack "$tarball" "$root"
# apt's archive directory on the cache, and the host's resolver (not /proc or
# /dev/shm: PID 1 mounts its own).
mkdir -p "$root/var/cache/apt/archives" "$root_cache/apt-archives/partial"
mount --bind "$root_cache/apt-archives" "$root/var/cache/apt/archives"
cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
echo "  root: $(basename "$tarball") unpacked in $((SECONDS - t0)) s"
for u in getty@.service serial-getty@.service console-getty.service container-getty@.service getty-static.service \
         systemd-sysctl.service systemd-binfmt.service proc-sys-fs-binfmt_misc.automount \
         proc-sys-fs-binfmt_misc.mount systemd-remount-fs.service systemd-modules-load.service \
         kmod-static-nodes.service systemd-pstore.service systemd-firstboot.service sys-kernel-debug.mount \
         sys-kernel-tracing.mount sys-kernel-config.mount sys-fs-fuse-connections.mount dev-hugepages.mount \
         dev-mqueue.mount systemd-journald-audit.socket apt-daily.timer apt-daily-upgrade.timer \
         dpkg-db-backup.timer e2scrub_all.timer fstrim.timer; do
  ln -sf /dev/null "$root/etc/systemd/system/$u"
done
mkdir -p "$work/.cg"
# A cgroup of this run, one path in every hierarchy: below the deepest cgroup
# this process is in (e.g. the memory cgroup that limits it). PID 1 takes the
# cgroup it starts in as its root (as in a container without a cgroup
# namespace, which systemd-detect-virt would report as one), so what systemd
# makes stays below it.
cgpath=$(awk -F: '{ if (length($3) > length(p)) p = $3 } END { print p }' /proc/self/cgroup)
cgpath=${cgpath%/}/$cgname
why=""
while IFS=: read -r id ctrl path; do
  [[ $cgpath == "${path%/}"/* ]] || { why+="cgroup '$ctrl' at $path, not above $cgpath; "; continue; }
  m=$work/.cg/$id
  mkdir -p "$m"
  if [ -z "$ctrl" ]; then
    mount -t cgroup2 cgroup2 "$m"
  elif [[ $ctrl == name=* ]]; then
    mount -t cgroup -o "none,$ctrl" cgroup "$m"
  else
    mount -t cgroup -o "$ctrl" cgroup "$m"
  fi || { why+="cannot mount the cgroup hierarchy '$ctrl'; "; continue; }
  cgmounts+=("$m")
  # The first directory made is the one removed at the end.
  top=$m$cgpath
  while [ ! -d "${top%/*}" ]; do top=${top%/*}; done
  mkdir -p "$m$cgpath" && cgdirs+=("$top") || { why+="cannot make $m$cgpath; "; continue; }
  # cpuset (v1): a new cgroup has no CPUs or memory nodes until given its parent's.
  for f in cpuset.cpus cpuset.mems; do
    [ -f "$m$cgpath/$f" ] || continue
    d=$m${path%/}
    for part in $(tr / ' ' <<<"${cgpath#"${path%/}"/}"); do
      [ -n "$(cat "$d/$part/$f")" ] || cat "$d/$f" >"$d/$part/$f"
      d=$d/$part
    done
  done
done < <(cat /proc/self/cgroup)
[ -z "$why" ] || skip_rest "$why"
(
  for m in "${cgmounts[@]}"; do echo "$BASHPID" >"$m$cgpath/cgroup.procs" || exit 1; done
  exec unshare --pid --fork --mount --propagation private --uts --net "$repo/tests/packaging/upgrade.sh" --pid1 "$root"
) >"$work/pid1.log" 2>&1 &
sd_outer=$!
for _ in $(seq 1 100); do
  sd=$(cat "/proc/$sd_outer/task/$sd_outer/children" 2>/dev/null | awk '{print $1}')
  [ -n "$sd" ] && [ "$(cat "/proc/$sd/comm" 2>/dev/null)" = systemd ] && break
  sd=""
  sleep 0.1
done
state=""
if [ -n "$sd" ]; then
  # systemctl talks to PID 1 on its private socket, there once it has started.
  for _ in $(seq 1 100); do in_sd test -S /run/systemd/private && break; sleep 0.1; done
  state=$(in_sd timeout 60 systemctl is-system-running --wait 2>&1)
  virt=$(in_sd systemd-detect-virt --container 2>&1)
  echo "  PID 1: $(in_sd cat /proc/1/comm) (pid $sd here), system $state, systemd-detect-virt: $(in_sd systemd-detect-virt) (--container: $virt), cgroup: $(grep -m1 -E 'name=systemd|^0::' "/proc/$sd/cgroup")"
fi
if { [ "$state" = running ] || [ "$state" = degraded ]; } && [ "$virt" = none ]; then
  [ "$state" = running ] || in_sd systemctl --failed --no-pager 2>&1 | sed 's/^/  /'
  ok boot
else
  cat "$work/pid1.log"
  [ -n "$sd" ] && in_sd systemctl --failed --no-pager 2>&1 | sed 's/^/  /'
  skip_rest "systemd did not boot the root as PID 1 (state '$state', systemd-detect-virt --container '${virt:-}')"
fi

# --- install --------------------------------------------------------------------
echo "== install"
mkdir -p "$root/tmp/debs"
for rev in $(seq 1 $((rounds + 1))); do cp -r "$work/debs-$rev" "$root/tmp/debs/$rev"; done
# dpkg may ask about a conffile only if it was edited; it is not.
mapfile -t debs < <(debs_of 1)
if ! sd_apt install "${debs[@]}" >"$work/install.log" 2>&1; then
  tail -30 "$work/install.log"
  bad install "apt-get install of the old packages failed"
  finish
fi
why=""
active=$(in_sd systemctl is-active dmagatherd.service)
[ "$active" = active ] || why+="the postinst did not start the unit ($active); "
in_sd systemctl start dmagatherd.service || why+="systemctl start failed; "
pid0=$(main_pid)
last_start_ns=$(now_ns)
health=$(in_sd dmagatherctl health 2>&1)
grep -q SERVING <<<"$health" || why+="dmagatherctl health: not SERVING; "
[ "$(in_sd dpkg-query -W -f='${Version}' dmagatherd)" = "$(version_of 1)" ] || why+="dmagatherd is not $(version_of 1); "
echo "  dmagatherd $(version_of 1) started by the postinst: MainPID $pid0, $(in_sd systemctl show -p Type --value dmagatherd.service), $(head -1 <<<"$health")"
if [ -z "$why" ]; then ok install; else in_sd journalctl -u dmagatherd --no-pager | tail -20; bad install "$why"; finish; fi

# --- job ------------------------------------------------------------------------
echo "== job"
# (After the boot: systemd-tmpfiles empties /tmp then.)
mkdir -p "$root/tmp/job"
cp tests/packaging/restart_job.c "$root/tmp/"
if ! in_sd sh -c 'cc -O2 -Wall -o /tmp/restart_job /tmp/restart_job.c $(pkg-config --cflags --libs dmagather)' \
     >"$work/cc.log" 2>&1; then
  cat "$work/cc.log"
  bad job "restart_job.c did not build against the installed packages"
  finish
fi
in_sd /tmp/restart_job "$world" /tmp/job "$pace_us" >"$work/job.out" 2>"$work/job.err" &
job_pid=$!
if wait_ops 200; then
  echo "  $world ranks at op $(ops_done)"
  ok job
else
  cat "$work/job.out" "$work/job.err"
  bad job "the job did not run"
  finish
fi

# --- restart and upgrade, under the job -----------------------------------------
stats_log=$work/stats.log
restart_under_job() {  # KIND ROUND COMMAND...: one restart, checked
  local kind=$1 round=$2 name
  shift 2
  name=$kind
  [ "$rounds" -eq 1 ] || name="${kind}[$round]"
  echo "== $name"
  local before pid t0 t1 line why=""
  # systemd's start limit (StartLimitBurst=5 in 10 s by default) counts
  # restarts too: at most one start every 2.2 s.
  while [ $(($(now_ns) - last_start_ns)) -lt 2200000000 ]; do sleep 0.1; done
  pid=$(main_pid)
  before=$(ops_done)
  t0=$(now_ns)
  "$@" >"$work/$kind-$round.log" 2>&1 || why+="'$*' failed: $(tail -3 "$work/$kind-$round.log" | tr '\n' ' '); "
  t1=$(now_ns)
  last_start_ns=$t1
  events+=("$kind $round $t0 $t1")
  why+=$(check_daemon "$pid")
  wait_ops $(($(ops_done) + 200)) || why+="the job did not go on; "
  line=$(restarts_line)
  { echo "$name: $(main_pid)"; in_sd dmagatherctl stats; } >>"$stats_log" 2>&1
  grep -q "^restarts: 1 jobs taken back from an earlier daemon ($world ranks," <<<"$line" ||
    why+="dmagatherctl stats: '$line'; "
  echo "  MainPID $pid -> $(main_pid); the command ran $(((t1 - t0) / 1000000)) ms; ops $before -> $(ops_done)"
  echo "  $line"
  if [ -z "$why" ]; then ok "$name"; else bad "$name" "$why"; fi
}
for round in $(seq 1 "$rounds"); do
  restart_under_job restart "$round" in_sd systemctl restart dmagatherd.service
  mapfile -t debs < <(debs_of $((round + 1)))
  restart_under_job upgrade "$round" sd_apt install "${debs[@]}"
  v=$(in_sd dpkg-query -W -f='${Version}' dmagatherd)
  [ "$v" = "$(version_of $((round + 1)))" ] || bad "upgrade" "dpkg says dmagatherd $v, not $(version_of $((round + 1)))"
  echo "  dpkg -s dmagatherd: Version: $v"
done

# --- job_end --------------------------------------------------------------------
echo "== job_end"
stop=$(($(ops_done) + 100))
echo "$stop" >"$root/tmp/job/stop.tmp" && mv "$root/tmp/job/stop.tmp" "$root/tmp/job/stop"
wait "$job_pid"
job_rc=$?
job_pid=""
sed 's/^/  /' "$work/job.out"
why=""
[ "$job_rc" -eq 0 ] && grep -q "^PASSED: $world ranks, 0 failed" "$work/job.out" || why+="the job exited $job_rc; "
for r in $(seq 0 $((world - 1))); do
  # Ops 0..stop-1 once each, in order, handle = op + 1, OK, nothing differing.
  bad_lines=$(awk -F, -v n="$stop" 'NR > 1 { i = NR - 2; if ($1 != i || $2 != i + 1 || $6 != "OK" || $7 != 0) b++ }
    END { if (NR - 1 != n) b++; print b + 0 }' "$root/tmp/job/rank$r.csv")
  [ "$bad_lines" -eq 0 ] || why+="rank $r: $bad_lines bad lines in its CSV (want ops 0..$((stop - 1)) once each, OK, 0 differing); "
done
n_restarts=$((2 * rounds))
waits=$(grep -c "waiting up to 120 s for dmagatherd to take the job back" "$work/job.err")
backs=$(grep -c "back on dmagatherd after .* the job goes on" "$work/job.err")
for r in $(seq 0 $((world - 1))); do
  w=$(grep -c "^dmagather: rank $r: .*waiting up to" "$work/job.err")
  b=$(grep -c "^dmagather: rank $r: back on dmagatherd" "$work/job.err")
  [ "$w" -eq "$n_restarts" ] && [ "$b" -eq "$n_restarts" ] || why+="rank $r logged $w wait and $b back lines (want $n_restarts each); "
done
echo "  the ranks' lines: $waits waits, $backs backs; e.g.:"
grep -m2 "^dmagather: rank 0:" "$work/job.err" | sed 's/^/    /'
# The gap of each restart, from the journal and the ranks' own timestamps: the
# new daemon logs `taken back ... going on after op N` (op handles; the old
# daemon finished ops up to N, the new one serves N+1 on); per rank, the gap is
# from its wait for op N returning to its wait for op N+1 returning (CSV lines
# N-1 and N); the max over the ranks. The journal splits it: systemd stopping
# the old daemon (SIGTERM), its exit, the new one's READY=1, the job taken back.
in_sd journalctl -u dmagatherd.service -o short-unix --no-pager >"$work/journal.log" 2>&1
csvs=$(for r in $(seq 0 $((world - 1))); do echo "$root/tmp/job/rank$r.csv"; done)
p50=$(awk -F, 'FNR > 2 { print $8 - prev } FNR > 1 { prev = $8 }' $csvs | sort -n |
      awk '{ a[NR] = $1 } END { printf "%.1f", a[int((NR + 1) / 2)] / 1e6 }')
echo "  op to op (one rank's waits returning), median over the job: $p50 ms"
[ -z "${DMAGATHER_UPGRADE_CSV:-}" ] || [ -s "$DMAGATHER_UPGRADE_CSV" ] ||
  echo "kind,round,gap_ms,command_ms,term_to_exit_ms,exit_to_ready_ms,ready_to_taken_back_ms,rank_wait_max_ms,op_p50_ms,op_n" \
    >"$DMAGATHER_UPGRADE_CSV"
ms() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", (b - a) * 1000 }'; }
i=0
for e in "${events[@]}"; do
  read -r kind round t0 t1 <<<"$e"
  i=$((i + 1))
  # t_term t_exit t_ready t_back N: the first of each from the command's start on.
  # The stop comes before the command returns (systemctl and the postinst wait for it).
  read -r t_term t_exit t_ready t_back n <<<"$(awk -v t0="$t0" -v t1="$t1" '
    { t = $1 * 1e9 } t < t0 - 1e6 { next } !a && t > t1 + 1e7 { exit }
    !a && /Stopping dmagatherd.service/ { a = $1; next }
    a && !b && /Stopped dmagatherd.service/ { b = $1; next }
    b && !c && /Started dmagatherd.service/ { c = $1; next }
    c && !d && /taken back from an earlier dmagatherd/ { d = $1; n = $NF; exit }
    END { printf "%s %s %s %s %d\n", a == "" ? 0 : a, b == "" ? 0 : b, c == "" ? 0 : c, d == "" ? 0 : d, n }' "$work/journal.log")"
  if [ "$n" -le 0 ] || [ "$n" -ge "$stop" ]; then
    why+="$kind $round: no 'taken back ... going on after op N' in the journal after the command; "
    continue
  fi
  gap=$(awk -F, -v n="$n" 'FNR == 1 { r++ } $1 == n - 1 { a = $8 } $1 == n { g = $8 - a; if (g > m) { m = g; rk = r - 1 } }
    END { printf "%.1f %d", m / 1e6, rk }' $csvs)
  # The ranks' own measure: the i-th `back on dmagatherd after S s` line of each rank.
  wait_max=$(awk -v i="$i" '/back on dmagatherd after/ { r = $3; k[r]++; if (k[r] == i && $8 * 1000 > m) m = $8 * 1000 }
    END { printf "%.0f", m }' "$work/job.err")
  row="$kind,$round,${gap% *},$(((t1 - t0) / 1000000)),$(ms "$t_term" "$t_exit"),$(ms "$t_exit" "$t_ready"),$(ms "$t_ready" "$t_back"),$wait_max,$p50,$n"
  echo "  $kind $round: gap ${gap% *} ms (op handles $n to $((n + 1)), rank ${gap#* }); SIGTERM to exit $(ms "$t_term" "$t_exit") ms," \
       "exit to the new daemon's READY=1 $(ms "$t_exit" "$t_ready") ms, READY=1 to the job taken back" \
       "$(ms "$t_ready" "$t_back") ms; the ranks waited up to $wait_max ms; the command ran $(((t1 - t0) / 1000000)) ms"
  [ -z "${DMAGATHER_UPGRADE_CSV:-}" ] || echo "$row" >>"$DMAGATHER_UPGRADE_CSV"
done
if [ -z "$why" ]; then ok job_end; else bad job_end "$why"; fi
if [ "${DMAGATHER_KEEP_LOGS:-}" = 1 ]; then
  cp "$work/job.err" "$work/stats.log" "$work"/root/tmp/job/*.csv "$work/" 2>/dev/null
fi
finish

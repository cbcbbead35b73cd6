# Clean Debian 12 roots for the package test (tests/packaging/run.sh) and the
# daemon image (tools/build_image.sh). Sourced, not run. Needs root,
# debootstrap and zstd (tools/install_deps.sh installs them).
#
#   root_tarball NAME [PACKAGE...]   prints the path of a cached tarball of
#       `debootstrap --variant=minbase bookworm` (NAME minbase, no PACKAGE), or
#       of that root plus PACKAGEs (apt-get, --no-install-recommends), with
#       apt's package lists; made when missing:
#       ${DMAGATHER_VENV_CACHE:-~/.cache/dmagather}/debian12-NAME-<key>.tar.zst,
#       key = hash of the mirror, the packages and the recipe below.
#   root_unpack TARBALL DIR          unpacks it (owners, modes and device nodes kept)
#   root_mount DIR / root_umount DIR /proc, a private /dev/shm, and apt's
#       archive directory on the cache (the .debs apt fetched stay there, so a
#       repeat install downloads nothing). Call them in a private mount
#       namespace (unshare --mount --propagation private) so nothing leaks out.
#   root_apt DIR ARGS...             apt-get in the root; when the lists in the
#       tarball are too old for the mirror, updates them and tries again.

DEBIAN_MIRROR=${DMAGATHER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
ROOT_RECIPE=1  # bump when the steps below change
root_cache=${DMAGATHER_VENV_CACHE:-$HOME/.cache/dmagather}

root_mount() {
  local d=$1
  mkdir -p "$d/proc" "$d/dev/shm" "$d/var/cache/apt/archives" "$root_cache/apt-archives/partial"
  mountpoint -q "$d/proc" || mount -t proc proc "$d/proc"
  mountpoint -q "$d/dev/shm" || mount -t tmpfs -o mode=1777 tmpfs "$d/dev/shm"
  mountpoint -q "$d/var/cache/apt/archives" || mount --bind "$root_cache/apt-archives" "$d/var/cache/apt/archives"
  # Name resolution for apt (the host's resolver).
  cp -L /etc/resolv.conf "$d/etc/resolv.conf" 2>/dev/null || true
}

root_umount() {
  local d=$1 m
  for m in var/cache/apt/archives dev/shm proc; do
    mountpoint -q "$d/$m" && umount -l "$d/$m"
  done
  return 0
}

root_apt() {
  local d=$1
  shift
  local env=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8)
  local apt=(apt-get -y -q -o APT::Install-Recommends=false -o Dpkg::Use-Pty=0 -o APT::Keep-Downloaded-Packages=true)
  chroot "$d" "${env[@]}" "${apt[@]}" "$@" && return 0
  echo "root_apt: retrying after apt-get update" >&2
  chroot "$d" "${env[@]}" apt-get -q update && chroot "$d" "${env[@]}" "${apt[@]}" "$@"
}

root_unpack() {
  mkdir -p "$2"
  zstd -q -dc "$1" | tar -C "$2" --numeric-owner -xpf -
}

root_tarball() {
  local name=$1
  shift
  local key
  key=$(printf '%s\n' "$DEBIAN_MIRROR" bookworm minbase "recipe=$ROOT_RECIPE" "$@" | sha256sum | cut -c1-12)
  local tarball=$root_cache/debian12-$name-$key.tar.zst
  mkdir -p "$root_cache"
  if [ -f "$tarball" ]; then
    echo "$tarball"
    return 0
  fi
  (
    set -e
    exec 9>"$tarball.lock"
    flock 9
    [ -f "$tarball" ] && exit 0
    local d
    d=$(mktemp -d "${TMPDIR:-/tmp}/dmagather-root.XXXXXX")
    trap 'root_umount "$d/root"; rm -rf "$d"' EXIT
    if [ $# -eq 0 ]; then
      echo "root_tarball: debootstrap bookworm (minbase) from $DEBIAN_MIRROR into $d/root" >&2
      nice -n 10 debootstrap --variant=minbase bookworm "$d/root" "$DEBIAN_MIRROR" >"$d/debootstrap.log" 2>&1 ||
        { tail -20 "$d/debootstrap.log" >&2; exit 1; }
    else
      # The minbase root (cached the same way) plus the packages.
      local base
      base=$(root_tarball minbase)
      root_unpack "$base" "$d/root"
    fi
    if [ $# -gt 0 ]; then
      echo "root_tarball: apt-get install $*" >&2
      root_mount "$d/root"
      root_apt "$d/root" install "$@" >"$d/apt.log" 2>&1 || { tail -20 "$d/apt.log" >&2; exit 1; }
      root_umount "$d/root"
    fi
    rm -f "$d/root/etc/resolv.conf"
    tar -C "$d/root" --numeric-owner -cpf - . | zstd -q -T0 -3 >"$tarball.tmp"
    mv "$tarball.tmp" "$tarball"
  ) || return 1
  echo "$tarball"
}

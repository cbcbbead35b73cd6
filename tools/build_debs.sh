#!/usr/bin/env bash
# Builds the Debian packages of dmagather into OUTDIR (default dist/debs):
#
#   dmagatherd         the daemon, dmagatherctl, the systemd unit, the
#                      tmpfiles.d entry, /etc/dmagather/dmagatherd.conf (a
#                      conffile: deploy/dmagatherd.conf.example), OPERATIONS.md
#   libdmagather0      libdmagather.so.<MAJOR>.<MINOR>.<PATCH> and its SONAME
#                      link libdmagather.so.<MAJOR>
#   libdmagather-dev   the headers, libdmagather.so, dmagather.pc (pkg-config)
#   python3-dmagather  the Python package (finds libdmagather.so.<MAJOR> through
#                      the dynamic linker) and the DMAGATHER_ALLGATHER=1 hook
#
#   tools/build_debs.sh [OUTDIR]
#
# The version is the C ABI's (DMAGATHER_VERSION_* in dmagather.h), the Debian
# revision ${DMAGATHER_DEB_REVISION:-1}. Depends lines of the binaries come from
# dpkg-shlibdeps (the Debian 12 libraries they were linked against). Packages
# are built with dpkg-deb (root:root owners, no fakeroot). Binaries are what
# this machine's Bazel build finds (the cuda backend only where the CUDA
# toolkit is: /usr/share/doc/dmagatherd/build_config.txt in the package says).
# Prints one `deb: PATH` line per package.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=$(mkdir -p "${1:-dist/debs}" && cd "${1:-dist/debs}" && pwd)

hdr=client/include/dmagather/dmagather.h
ver_part() { sed -nE "s/^#define DMAGATHER_VERSION_$1 ([0-9]+)$/\1/p" "$hdr"; }
MAJOR=$(ver_part MAJOR) MINOR=$(ver_part MINOR) PATCH=$(ver_part PATCH)
[ -n "$MAJOR" ] && [ -n "$MINOR" ] && [ -n "$PATCH" ] || { echo "build_debs: no version in $hdr" >&2; exit 1; }
VERSION=$MAJOR.$MINOR.$PATCH
DEBVER=$VERSION-${DMAGATHER_DEB_REVISION:-1}
ARCH=$(dpkg --print-architecture)
MULTIARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
MAINTAINER=${DMAGATHER_DEB_MAINTAINER:-dmagather maintainers <dmagather@localhost>}
LIBPKG=libdmagather$MAJOR

nice -n 10 bazel build //server:dmagatherd //tools:dmagatherctl //client:libdmagather.so //:build_config >&2
bin=$(bazel info bazel-bin 2>/dev/null)

soname=$(readelf -d "$bin/client/libdmagather.so" | sed -nE 's/.*\(SONAME\).*\[(.*)\]/\1/p')
[ "$soname" = "libdmagather.so.$MAJOR" ] || {
  echo "build_debs: libdmagather.so has SONAME '$soname', dmagather.h says major $MAJOR" >&2; exit 1; }
grep -q "^version = \"$VERSION\"$" client/python/pyproject.toml || {
  echo "build_debs: client/python/pyproject.toml's version is not $VERSION (dmagather.h)" >&2; exit 1; }
grep -q "^SONAME = \"libdmagather.so.$MAJOR\"$" client/python/dmagather/__init__.py || {
  echo "build_debs: client/python/dmagather/__init__.py SONAME is not libdmagather.so.$MAJOR" >&2; exit 1; }
extra=$(nm -D --defined-only "$bin/client/libdmagather.so" | awk '$2 ~ /^[A-Z]$/ && $3 !~ /^dmagather_/' | head -3)
[ -z "$extra" ] || { echo "build_debs: libdmagather.so exports more than dmagather_*: $extra" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# dpkg-shlibdeps wants a source tree with debian/control naming the packages.
mkdir -p "$stage/src/debian"
cat >"$stage/src/debian/control" <<EOF
Source: dmagather
Maintainer: $MAINTAINER

Package: dmagatherd
Architecture: any

Package: $LIBPKG
Architecture: any
EOF
shlibdeps() {  # FILE...: the shlibs:Depends value
  (cd "$stage/src" && dpkg-shlibdeps -O "${@/#/-e}" 2>/dev/null) | sed -n 's/^shlibs:Depends=//p'
}

doc() {  # PKGROOT PKG: copyright
  install -d "$1/usr/share/doc/$2"
  install -m 0644 packaging/debian/copyright "$1/usr/share/doc/$2/copyright"
}

finish() {  # PKGROOT PKG SECTION DEPENDS DESCRIPTION [EXTRA CONTROL LINES]
  local root=$1 pkg=$2 section=$3 depends=$4 desc=$5 extra=${6:-}
  install -d "$root/DEBIAN"
  local size
  size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
  {
    echo "Package: $pkg"
    echo "Version: $DEBVER"
    echo "Architecture: $ARCH"
    echo "Maintainer: $MAINTAINER"
    echo "Installed-Size: $size"
    [ -z "$depends" ] || echo "Depends: $depends"
    [ -z "$extra" ] || printf '%s\n' "$extra"
    echo "Section: $section"
    echo "Priority: optional"
    echo "Description: $desc"
  } >"$root/DEBIAN/control"
  (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0r md5sum) \
    >"$root/DEBIAN/md5sums"
  local f="$out/${pkg}_${DEBVER}_${ARCH}.deb"
  dpkg-deb --root-owner-group -Zxz -b "$root" "$f" >/dev/null
  echo "deb: $f"
}

# --- dmagatherd ---------------------------------------------------------------
r=$stage/dmagatherd
install -d "$r/usr/bin" "$r/lib/systemd/system" "$r/usr/lib/tmpfiles.d" "$r/etc/dmagather" \
  "$r/usr/share/doc/dmagather"
install -m 0755 "$bin/server/dmagatherd" "$bin/tools/dmagatherctl" "$r/usr/bin/"
strip --strip-unneeded "$r/usr/bin/dmagatherd" "$r/usr/bin/dmagatherctl"
install -m 0644 deploy/dmagatherd.service "$r/lib/systemd/system/dmagatherd.service"
install -m 0644 deploy/tmpfiles.d-dmagather.conf "$r/usr/lib/tmpfiles.d/dmagather.conf"
install -m 0644 deploy/dmagatherd.conf.example "$r/etc/dmagather/dmagatherd.conf"
# The unit's Documentation= points here.
install -m 0644 docs/OPERATIONS.md "$r/usr/share/doc/dmagather/OPERATIONS.md"
doc "$r" dmagatherd
install -m 0644 deploy/dmagatherd.conf.example "$r/usr/share/doc/dmagatherd/dmagatherd.conf.example"
install -m 0644 "$bin/build_config.txt" "$r/usr/share/doc/dmagatherd/build_config.txt"
install -d "$r/DEBIAN"
echo /etc/dmagather/dmagatherd.conf >"$r/DEBIAN/conffiles"
for s in postinst prerm postrm; do install -m 0755 "packaging/debian/dmagatherd.$s" "$r/DEBIAN/$s"; done
dep=$(shlibdeps "$r/usr/bin/dmagatherd" "$r/usr/bin/dmagatherctl")
finish "$r" dmagatherd net "$dep, passwd" \
  "AllGather daemon of dmagather (GPU DMA copy engines, CPU backend)
 dmagatherd serves the parameter all-gathers of training ranks on one node
 (DeepSpeed ZeRO-3, PyTorch FSDP2) with the GPU's copy engines, or with
 shared memory and worker threads on its host backend. Ranks link
 libdmagather. This package has the daemon, dmagatherctl (health, stats,
 metrics), the systemd unit and its configuration in /etc/dmagather." \
  "Recommends: systemd"

# --- libdmagather0 ------------------------------------------------------------
r=$stage/$LIBPKG
libdir=usr/lib/$MULTIARCH
install -d "$r/$libdir"
install -m 0644 "$bin/client/libdmagather.so" "$r/$libdir/libdmagather.so.$VERSION"
strip --strip-unneeded "$r/$libdir/libdmagather.so.$VERSION"
ln -s "libdmagather.so.$VERSION" "$r/$libdir/libdmagather.so.$MAJOR"
doc "$r" "$LIBPKG"
install -d "$r/DEBIAN"
echo "libdmagather $MAJOR $LIBPKG (>= $VERSION)" >"$r/DEBIAN/shlibs"
echo "activate-noawait ldconfig" >"$r/DEBIAN/triggers"
dep=$(shlibdeps "$r/$libdir/libdmagather.so.$VERSION")
finish "$r" "$LIBPKG" libs "$dep" \
  "client library of dmagather (C ABI)
 libdmagather is what training ranks link to submit AllGathers to the node's
 dmagatherd: shared-memory rings, stream-ordered completions, errors as
 statuses. Only the dmagather_* C symbols are exported; gRPC is inside it."

# --- libdmagather-dev ---------------------------------------------------------
r=$stage/libdmagather-dev
install -d "$r/usr/include/dmagather" "$r/$libdir/pkgconfig"
install -m 0644 client/include/dmagather/dmagather.h client/include/dmagather/client.h "$r/usr/include/dmagather/"
ln -s "libdmagather.so.$MAJOR" "$r/$libdir/libdmagather.so"
sed -e "s|@MULTIARCH@|$MULTIARCH|" -e "s|@VERSION@|$VERSION|" packaging/debian/dmagather.pc.in \
  >"$r/$libdir/pkgconfig/dmagather.pc"
doc "$r" libdmagather-dev
finish "$r" libdmagather-dev libdevel "$LIBPKG (= $DEBVER)" \
  "client library of dmagather (headers, pkg-config)
 The C header dmagather/dmagather.h, the header-only C++ wrapper
 dmagather/client.h, and dmagather.pc: cc prog.c \$(pkg-config --cflags --libs dmagather)."

# --- python3-dmagather --------------------------------------------------------
r=$stage/python3-dmagather
site=usr/lib/python3/dist-packages
install -d "$r/$site/dmagather"
for f in client/python/dmagather/*.py; do install -m 0644 "$f" "$r/$site/dmagather/"; done
install -m 0644 client/python/dmagather_autoload.pth "$r/$site/dmagather_autoload.pth"
doc "$r" python3-dmagather
install -d "$r/DEBIAN"
install -m 0755 packaging/debian/python3-dmagather.prerm "$r/DEBIAN/prerm"
finish "$r" python3-dmagather python "python3:any, $LIBPKG (= $DEBVER)" \
  "Python client of dmagather (ctypes, torch adapters)
 import dmagather (ctypes over libdmagather), dmagather.torch (serves
 torch.distributed.all_gather_into_tensor, FSDP2's custom all-gather),
 python3 -m dmagather.check, and the start-up hook: DMAGATHER_ALLGATHER=1
 in a rank's environment is the only switch." \
  "Suggests: python3-torch"

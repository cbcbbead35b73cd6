#!/usr/bin/env bash
# Builds the DaemonSet's image (deploy/k8s/daemonset.yaml) as an OCI image
# layout, with Debian's tools only (no container engine): a Debian 12 minbase
# root (debootstrap, cached: packaging/debian12_root.sh), the dmagatherd
# package installed into it with apt (its dependencies from the Debian
# mirror), packed as one layer by umoci.
#
#   tools/build_image.sh [OUTDIR]      (default dist/image; needs root)
#
# Writes OUTDIR/dmagatherd (the OCI layout, tag <version>, e.g. 0.4.0) and
# OUTDIR/dmagatherd-<version>.oci.tar (the same layout as one file). Uses the
# packages in $DMAGATHER_DEBS when set, else builds them (tools/build_debs.sh).
# Push / load it with skopeo or containerd, e.g.
#   skopeo copy oci:dist/image/dmagatherd:0.4.0 docker://REGISTRY/dmagather/dmagatherd:0.4.0
#   ctr -n k8s.io images import --base-name dmagather/dmagatherd dist/image/dmagatherd-0.4.0.oci.tar
# Prints `image: LAYOUT:TAG` last.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "build_image: needs root (debootstrap, chroot)" >&2; exit 1; }
out=$(mkdir -p "${1:-dist/image}" && cd "${1:-dist/image}" && pwd)

# Everything below runs in a private mount namespace: the root's mounts never
# leak into the host and go away with the script.
if [ -z "${DMAGATHER_IN_PRIVATE_NS:-}" ]; then
  DMAGATHER_IN_PRIVATE_NS=1 exec unshare --mount --propagation private "$0" "$out"
fi
. packaging/debian12_root.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/dmagather-image.XXXXXX")
trap 'root_umount "$work/root"; rm -rf "$work"' EXIT

debs=${DMAGATHER_DEBS:-}
if [ -z "$debs" ]; then
  debs=$work/debs
  tools/build_debs.sh "$debs" >&2
fi
deb=$(ls "$debs"/dmagatherd_*.deb | head -1)
version=$(dpkg-deb -f "$deb" Version)
tag=${version%-*}

tarball=$(root_tarball minbase)
root_unpack "$tarball" "$work/root"
root_mount "$work/root"
cp "$deb" "$work/root/tmp/"
root_apt "$work/root" install "/tmp/$(basename "$deb")" >&2
rm -f "$work/root/tmp/$(basename "$deb")"
root_umount "$work/root"
# What an image does not need: apt's lists and caches, manuals, locales.
r=$work/root
rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/debconf/*-old "$r"/var/log/* \
  "$r"/usr/share/man "$r"/usr/share/info "$r"/usr/share/locale "$r"/etc/resolv.conf "$r"/tmp/* "$r"/root/.cache
find "$r/usr/share/doc" -mindepth 1 -maxdepth 1 ! -name 'dmagather*' ! -name 'libdmagather*' -exec rm -rf {} +
install -d -m 0755 "$r/run/dmagather"

layout=$out/dmagatherd
rm -rf "$layout"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci unpack --image "$layout:$tag" "$work/bundle" >/dev/null
tar -C "$r" --numeric-owner -cpf - . | tar -C "$work/bundle/rootfs" --numeric-owner -xpf -
umoci repack --image "$layout:$tag" "$work/bundle"
umoci config --image "$layout:$tag" --os linux --architecture "$(dpkg --print-architecture)" \
  --author "dmagather" \
  --config.entrypoint /usr/bin/dmagatherd \
  --config.cmd --socket=/run/dmagather/dmagatherd.sock --config.cmd --backend=auto \
  --config.env PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  --config.volume /run/dmagather \
  --config.stopsignal SIGTERM \
  --config.label org.opencontainers.image.title=dmagatherd \
  --config.label org.opencontainers.image.version="$version" \
  --config.label org.opencontainers.image.description="dmagather AllGather daemon (Debian 12, package dmagatherd $version)"
umoci gc --layout "$layout"
(cd "$out" && tar --sort=name --owner=0 --group=0 --numeric-owner -cf "dmagatherd-$tag.oci.tar" -C dmagatherd .)
echo "image layers: $(du -sh "$layout/blobs" | cut -f1), root $(du -sh --apparent-size "$r" | cut -f1)" >&2
echo "image: $layout:$tag"

#!/usr/bin/env bash
# check_unit.sh: `systemd-analyze verify` of deploy/dmagatherd.service (with
# ExecStart pointed at the dmagatherd this tree built, since /usr/bin has
# none on a build machine), then `systemd-analyze security` of it for the
# exposure score. Exit 0 when the unit verifies clean (any warning fails);
# exit 77 (skipped: tools/test.sh counts it as a skip, never a pass) with one
# clear SKIPPED line when systemd-analyze cannot run here.
#
#   tools/check_unit.sh [path/to/dmagatherd]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-$PWD/bazel-bin/server/dmagatherd}
if ! command -v systemd-analyze >/dev/null; then
  echo "check_unit: SKIPPED: systemd-analyze is not installed (tools/install_deps.sh installs systemd)"
  exit 77
fi
[ -x "$bin" ] || { echo "check_unit: FAILED: no dmagatherd at $bin (bazel build //server:dmagatherd)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s|^ExecStart=/usr/bin/dmagatherd|ExecStart=$(readlink -f "$bin")|" deploy/dmagatherd.service >"$tmp/dmagatherd.service"
out=$(systemd-analyze verify "$tmp/dmagatherd.service" 2>&1)
rc=$?
# Said by systemd-analyze about the machine, not the unit (a container
# without systemd as PID 1, no /run/systemd): cannot judge the unit here.
if [ $rc -ne 0 ] && grep -qiE "Failed to (initialize manager|connect to bus|setup working directory)|Operation not permitted" <<<"$out"; then
  echo "check_unit: SKIPPED: systemd-analyze cannot run in this environment: $(head -1 <<<"$out")"
  exit 77
fi
# The unit names nvidia-persistenced.service in After= (not installed on a
# machine without the driver): that ordering reference is not an error.
out=$(grep -v "nvidia-persistenced.service" <<<"$out")
if [ $rc -ne 0 ] || [ -n "$out" ]; then
  echo "check_unit: FAILED: systemd-analyze verify deploy/dmagatherd.service (exit $rc):" >&2
  echo "$out" >&2
  exit 1
fi
score=$(systemd-analyze security --offline=yes "$tmp/dmagatherd.service" 2>/dev/null | sed -nE 's/.*Overall exposure level for .*: (.*)/\1/p')
echo "check_unit: OK: deploy/dmagatherd.service verifies clean${score:+; systemd-analyze security: $score}"

#!/usr/bin/env bash
# Makes the Python environment of the trainer tests (tests/trainers/): a venv
# with torch and DeepSpeed from PyPI at pinned versions, plus the
# dmagather package itself (client/python, as a .pth path entry) and its
# interpreter-startup hook (dmagather_autoload.pth, the DMAGATHER_ALLGATHER=1
# switch; docs/TRAINERS.md).
#
# Idempotent: the venv lives outside the checkout, in
#   ${DMAGATHER_VENV_CACHE:-$HOME/.cache/dmagather}/venv-<hash of the pins>
# and is reused while the pins and the install recipe are unchanged (a stamp
# file is written last, so an interrupted install is redone). pip's own cache
# (downloaded wheels, DeepSpeed's wheel built from its sdist) sits beside it
# and survives a change of pins. Only the checkout's hook files are refreshed
# on every call (they point at this checkout).
#
# torch from PyPI: its Linux x86_64 wheel depends on the CUDA wheels (the
# CPU-only index is not reachable from CI), 4.7 GB installed; it runs on
# CPU all the same. Measured on a 2-core machine: cold (empty cache) 98-177 s,
# warm (venv present) 1.5 s (docs/TESTING.md).
#
# Which torch: `tools/install_venv.sh [oldest|newest]` (default oldest).
#   oldest  tools/venv-requirements.txt         the oldest torch dmagather supports
#   newest  tools/venv-requirements-newest.txt  the newest torch on PyPI when pinned
# (dmagather/_torch_entry.py's TESTED_TORCH names both; CI runs the trainer
# tests on each.) Each gets its own venv.
#
# Prints the venv's path as its last line: `venv: /path`.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-oldest}" in
  oldest) REQS=tools/venv-requirements.txt ;;
  newest) REQS=tools/venv-requirements-newest.txt ;;
  *) echo "usage: $0 [oldest|newest]" >&2; exit 2 ;;
esac
TORCH_VERSION=$(sed -n 's/^torch==//p' "$REQS")
DEEPSPEED_VERSION=0.19.8
RECIPE=3  # bump when the steps below change

py=${DMAGATHER_VENV_PYTHON:-}
if [ -z "$py" ]; then
  for c in python3.11 python3 /usr/bin/python3; do
    if command -v "$c" >/dev/null && "$c" -c 'import venv, ensurepip' 2>/dev/null; then
      py=$(command -v "$c")
      break
    fi
  done
fi
[ -n "$py" ] || { echo "install_venv: no python3 with venv+ensurepip" >&2; exit 1; }

cache=${DMAGATHER_VENV_CACHE:-$HOME/.cache/dmagather}
key=$(printf '%s\n' "$("$py" -c 'import sys; print(sys.version)')" "$(cat "$REQS")" \
        "deepspeed==$DEEPSPEED_VERSION" "recipe=$RECIPE" | sha256sum | cut -c1-12)
venv=$cache/venv-$key
export PIP_CACHE_DIR=$cache/pip
mkdir -p "$cache" "$PIP_CACHE_DIR"

t0=$SECONDS
if [ -f "$venv/.complete" ]; then
  echo "install_venv: reusing $venv (torch $TORCH_VERSION, deepspeed $DEEPSPEED_VERSION)"
else
  echo "install_venv: creating $venv (torch $TORCH_VERSION, deepspeed $DEEPSPEED_VERSION; cold: 2-5 minutes, 4.7-5.6 GB)"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)
  echo "install_venv: [1/2] torch and DeepSpeed's requirements"
  "${pip[@]}" install --progress-bar off -r "$REQS"
  # DeepSpeed is an sdist only: built against the torch above (no ops are
  # compiled at install; DS_BUILD_OPS=0), then kept in pip's wheel cache.
  echo "install_venv: [2/2] deepspeed $DEEPSPEED_VERSION"
  DS_BUILD_OPS=0 "${pip[@]}" install --progress-bar off --no-build-isolation --no-deps \
    "deepspeed==$DEEPSPEED_VERSION"
  "$venv/bin/python" -c 'import torch, deepspeed; print("install_venv: torch", torch.__version__, "deepspeed", deepspeed.__version__)'
  touch "$venv/.complete"
fi

# This checkout's package and hook (rewritten every time: the checkout moves).
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -f "$site"/dmagather-checkout.pth "$site"/dmagather_autoload.pth
printf '%s\n' "$PWD/client/python" >"$site/dmagather-checkout.pth"
cp client/python/dmagather_autoload.pth "$site/dmagather_autoload.pth"

echo "install_venv: done in $((SECONDS - t0)) s; $(du -sh "$venv" 2>/dev/null | cut -f1) in the venv"
echo "venv: $venv"

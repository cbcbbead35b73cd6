#!/usr/bin/env bash
# Installs the Debian 12 packages dmagather builds and tests with, only those
# that are missing (idempotent; a no-op on a prepared machine).
#
#   tools/install_deps.sh [--mpi]    --mpi: also Open MPI, matplotlib and
#                                    iperf3, for the benchmarks that compare
#                                    with Open MPI and the link rate
set -euo pipefail

PKGS=(
  bazel-bootstrap bazel-platforms bazel-rules-java   # Bazel 4.2.3, offline
  g++ pkg-config
  libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev libgoogle-glog-dev libgtest-dev libgmock-dev
  libsystemd-dev libibverbs-dev
  libcpp-httplib-dev                                 # dmagatherd --metrics_listen (GET /metrics)
  libamdhip64-dev libhsa-runtime-dev                 # the hip backend (HIP 5.2.3 headers; libamdhip64 is dlopened)
  clang-14 libclang-rt-14-dev                        # tools/fuzz.sh: libFuzzer + ASan/UBSan runtimes
  clang-format-14                                    # tools/check_format.sh: the tree as .clang-format lays it out
  systemd                                            # tools/check_unit.sh: systemd-analyze verify
  dpkg-dev debootstrap umoci zstd                    # tools/build_debs.sh, tools/build_image.sh, tests/packaging
  python3 python3-numpy python3-grpcio python3-protobuf
  python3-yaml                                       # tests/deploy:k8s_test (the Kubernetes files)
  python3-torch                                      # tests/python:torch_adapter_test (torch 1.13 CPU, gloo)
)
case "${1:-}" in
  "") ;;
  --mpi) PKGS+=(openmpi-bin libopenmpi-dev python3-matplotlib iperf3) ;;
  *) echo "usage: $0 [--mpi]" >&2; exit 2 ;;
esac

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

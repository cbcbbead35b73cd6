#!/usr/bin/env bash
# Installs the Debian 12 packages dmagather builds and tests with, only those
# that are missing (idempotent; a no-op on a prepared machine).
#
#   tools/install_deps.sh [--mpi]    --mpi: also Open MPI, matplotlib and
#                                    iperf3, for the benchmarks that compare
#                                    with Open MPI and the link rate
#   tools/install_deps.sh --launchers    only the launchers of
#                                    tests/trainers/launchers_test.py (pdsh,
#                                    SLURM, munge; tests/trainers/run.sh
#                                    calls it as root)
set -euo pipefail

# The multi-node launchers the trainer tests run for real: DeepSpeed's runner
# starts the nodes through pdsh; SLURM's srun through slurmctld, one slurmd
# per node, munge for authentication. The tests run daemons of their own,
# with their own configuration and key; the packages' services do not start
# without /etc/slurm/slurm.conf (slurmd, slurmctld), and munged's, on a booted
# host, is not used.
LAUNCHERS=(pdsh slurmctld slurmd slurm-client munge)

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
  "${LAUNCHERS[@]}"                                  # tests/trainers/launchers_test.py
)
case "${1:-}" in
  "") ;;
  --mpi) PKGS+=(openmpi-bin libopenmpi-dev python3-matplotlib iperf3) ;;
  --launchers) PKGS=("${LAUNCHERS[@]}") ;;
  *) echo "usage: $0 [--mpi|--launchers]" >&2; exit 2 ;;
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

#!/usr/bin/env bash
# Installs the Debian 12 packages rdmaflow builds and tests with. Idempotent:
# does nothing when everything is already installed. Needs root (or sudo).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libibverbs-dev librdmacm-dev ibverbs-utils rdmacm-utils
  libucx-dev ucx-utils
  libboost-dev libeigen3-dev libgtest-dev libgmock-dev libspdlog-dev nlohmann-json3-dev
  libcli11-dev
  # HMAC for the job handshake (common/handshake.cc) and RDMAFLOW_TLS (common/tls.cc);
  # the openssl tool makes tls_test's certificates
  libssl-dev openssl
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libgloo-dev libopenmpi-dev openmpi-bin libpmix-dev
  clang libclang-rt-14-dev clang-format
  iproute2 python3
  # pictures for the docs: a merged timeline trace (scripts/trace-plot.py)
  python3-matplotlib
  # the Python package and torch.distributed backend (python/): Debian's torch
  python3-dev python3-torch libtorch-dev pybind11-dev python3-pytest python3-numpy
  python3-torchvision
  # the ONNX model loader (graph/onnx) and the ONNX tests' export and seeds
  libonnx-dev python3-onnx
  # benchmark plots (scripts/plot-bench.py)
  python3-matplotlib
  # the cluster in a box (scripts/cluster): namespaces, Slurm and its munge
  util-linux slurm-wlm munge
  # fault tests across the simulated hosts (tests/cluster/faults_test.sh): partitions
  nftables
  # the targets run's iperf3 ring (scripts/cluster-bench --only targets)
  iperf3
  # the soft-RoCE guest (scripts/softroce-vm): QEMU, debootstrap, initramfs packing
  qemu-system-x86 debootstrap cpio zstd
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"

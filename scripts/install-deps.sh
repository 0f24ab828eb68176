#!/usr/bin/env bash
# Installs what Strata needs, with apt, and only what is missing: run it as
# often as you like. Debian 12 (bookworm).
#   install-deps.sh --train   what building and training need (scripts/train.sh)
#   install-deps.sh [--test]  that and what the whole test suite needs
#                             (scripts/test.sh)
set -euo pipefail

FOR=test
case "${1:-}" in
  --train) FOR=train ;;
  --test | "") FOR=test ;;
  *) echo "install-deps.sh: unknown argument '$1' (--train or --test)" >&2; exit 2 ;;
esac

# Building the daemons and training on a local cluster.
PACKAGES=(
  build-essential cmake pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgoogle-glog-dev libgflags-dev
  libibverbs-dev libopenblas-dev libyaml-cpp-dev zlib1g-dev libzstd-dev
  libcurl4-openssl-dev libssl-dev
  # etcd's v3 API .proto files, compiled into the master's etcd client
  # (master high availability; master/CMakeLists.txt).
  golang-etcd-server-dev
  dataset-fashion-mnist
  iproute2 procps curl python3
)
VM_PACKAGES=()
if [[ $FOR == test ]]; then
  # The tests themselves; the fuzz targets (scripts/fuzz.sh) and the clang
  # thread-safety pass: clang, libFuzzer and the sanitizers' runtimes,
  # llvm-symbolizer for their reports; clang-format for the layout check
  # (scripts/format.sh --check).
  PACKAGES+=(libgtest-dev libgmock-dev clang-14 libclang-rt-14-dev llvm-14 clang-format-14)
  # The Python package (python/, docs/python.md): built against Debian's
  # python3 and pybind11, tested with pytest and PyTorch.
  PACKAGES+=(python3-dev pybind11-dev python3-pytest python3-torch python3-numpy python3-yaml)
  # A real etcd (and etcdctl) for the master's high-availability tests.
  PACKAGES+=(etcd-server etcd-client)
  # For the Soft-RoCE guest of tests/rdma (a real verbs device under QEMU).
  # Best effort: without them that one test is skipped, saying why.
  VM_PACKAGES=(qemu-system-x86 debootstrap e2fsprogs)
  # For tests/storage's real single-node Ceph (radosgw for S3, CephFS
  # through ceph-fuse) and the s3cmd baseline of bench/s3_bench.sh. Best
  # effort too.
  VM_PACKAGES+=(ceph-mon ceph-osd radosgw ceph-common ceph-mds ceph-fuse s3cmd uuid-runtime)
  # For tests/ops: systemd-analyze checks the units (no systemd need run), a
  # real Prometheus scrapes a cluster, sshd serves the multi-host test,
  # headless Chromium loads the master's status page, systemd-nspawn boots
  # hosts with systemd as PID 1 for launch.sh --systemd, nftables loads
  # conf/nftables-strata.nft (the per-host connection cap).
  VM_PACKAGES+=(systemd systemd-container prometheus openssh-server openssh-client chromium
                nftables)
  # For tests/e2e/slurm_test.sh: a real slurmctld and slurmd (and munged)
  # that the test starts itself, for scripts/slurm/.
  VM_PACKAGES+=(slurm-wlm munge)
fi

missing_of() {
  local p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      echo "$p"
    fi
  done
}
mapfile -t missing < <(missing_of "${PACKAGES[@]}")
vm_missing=()
if [[ ${#VM_PACKAGES[@]} -gt 0 ]]; then
  mapfile -t vm_missing < <(missing_of "${VM_PACKAGES[@]}")
fi

if [[ ${#missing[@]} -eq 0 && ${#vm_missing[@]} -eq 0 ]]; then
  echo "install-deps: all $((${#PACKAGES[@]} + ${#VM_PACKAGES[@]})) packages for $FOR present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [[ ${#vm_missing[@]} -gt 0 ]]; then
  # Best effort, and never fatal: a machine without them (or offline, or
  # without sudo) still builds and runs everything else.
  echo "install-deps: installing ${vm_missing[*]} (for the Soft-RoCE guest, the Ceph and the ops tests)"
  { [[ ${#missing[@]} -gt 0 ]] || $SUDO apt-get update -qq; } &&
    $SUDO apt-get install -y -qq --no-install-recommends "${vm_missing[@]}" ||
    echo "install-deps: could not install ${vm_missing[*]}; tests/rdma, the Ceph or the ops tests will be skipped" >&2
fi

#!/usr/bin/env bash
# The Soft-RoCE harness (docs/rdma.md): boots a QEMU guest whose kernel
# gives a real verbs device (rxe0) and runs the project's RDMA checks in it
# with the binaries of BUILD_DIR.
#
#   tests/rdma/run-vm-tests.sh BUILD_DIR
#
# The guest image is built once (tests/rdma/build-image.sh, about 90 s on an
# idle machine) and cached in $STRATA_RDMA_VM_CACHE (default
# ~/.cache/strata/rdma-vm), keyed by the build script. Without QEMU or
# debootstrap, or without root to build the image, it exits 77 (ctest:
# skipped) saying why.
set -euo pipefail
BUILD="$(cd "${1:?usage: run-vm-tests.sh BUILD_DIR}" && pwd)"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
skip() { echo "SKIP: $*"; exit 77; }

command -v qemu-system-x86_64 >/dev/null || skip "no qemu-system-x86_64 (apt-get install qemu-system-x86)"
[[ -x "$BUILD/bin/strata" ]] || { echo "run-vm-tests.sh: $BUILD/bin/strata not built" >&2; exit 1; }

key="$(cat "$HERE/build-image.sh" "$HERE/guest-init" | sha256sum | cut -c1-12)"
CACHE="${STRATA_RDMA_VM_CACHE:-$HOME/.cache/strata/rdma-vm}"
IMG="$CACHE/$key"
if [[ ! -f "$IMG/rootfs.ext4" ]]; then
  command -v debootstrap >/dev/null || skip "no debootstrap to build the guest image (apt-get install debootstrap)"
  [[ $(id -u) -eq 0 ]] || skip "building the guest image needs root (debootstrap); run once as root"
  echo "run-vm-tests.sh: building the guest image in $IMG (once)"
  rm -rf "$IMG.tmp"
  if ! "$HERE/build-image.sh" "$IMG.tmp"; then
    # The image is test infrastructure (a Debian mirror, debootstrap), not
    # Strata: say why and skip rather than fail.
    tail -n 5 "$IMG.tmp/debootstrap.log" 2>/dev/null || true
    rm -rf "$IMG.tmp"
    skip "the guest image could not be built (tests/rdma/build-image.sh failed; see above)"
  fi
  mv "$IMG.tmp" "$IMG"
fi

SHARE="$(mktemp -d /tmp/strata-rdma-vm.XXXXXX)"
trap 'rm -rf "$SHARE"' EXIT
mkdir -p "$SHARE/bin" "$SHARE/lib" "$SHARE/tests"
cp "$BUILD/bin/strata" "$SHARE/bin/"
cp "$BUILD/tests/rdma_device_test" "$BUILD/tests/rdma_verbs_test" "$SHARE/tests/"
cp "$ROOT/conf/local.yaml" "$SHARE/job.yaml"
# The binaries' libraries, but the guest's own glibc and rdma-core (the
# guest's libibverbs finds the rxe provider).
for f in "$SHARE"/bin/* "$SHARE"/tests/*; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libibverbs|libnl-[^/]*)\.so' |
  xargs -r cp -L -t "$SHARE/lib/"
install -m755 "$HERE/guest-tests.sh" "$SHARE/run.sh"

echo "run-vm-tests.sh: booting the guest (QEMU TCG, 2 vCPUs)"
start=$SECONDS
rc=0
timeout "${STRATA_RDMA_VM_TIMEOUT:-600}" qemu-system-x86_64 \
  -accel tcg,thread=multi -cpu max -smp 2 -m 2048 -nographic -no-reboot \
  -kernel "$IMG/vmlinuz" -initrd "$IMG/initrd.img" \
  -append "root=/dev/vda rw console=ttyS0 net.ifnames=0 init=/sbin/strata-guest-init panic=-1 quiet loglevel=3" \
  -drive file="$IMG/rootfs.ext4",format=raw,if=virtio,cache=unsafe,snapshot=on \
  -virtfs local,path="$SHARE",mount_tag=share,security_model=none,id=share \
  -nic none </dev/null >"$SHARE/console.log" 2>&1 || rc=$?
[[ -f "$SHARE/guest.log" ]] && cat "$SHARE/guest.log"
guest_rc="$(cat "$SHARE/run.rc" 2>/dev/null || echo none)"
echo "run-vm-tests.sh: qemu exit $rc, guest checks exit $guest_rc, $((SECONDS - start)) s"
if [[ $rc -ne 0 || "$guest_rc" != 0 ]]; then
  echo "--- guest console (last 30 lines):"
  tail -n 30 "$SHARE/console.log"
  exit 1
fi

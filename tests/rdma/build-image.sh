#!/bin/sh
# Builds the Soft-RoCE test guest: a Debian 12 root with rdma-core, perftest
# and a kernel whose rdma_rxe gives a real verbs device (docs/rdma.md).
#
#   tests/rdma/build-image.sh OUTDIR      (as root; needs debootstrap, e2fsprogs)
#
# Writes OUTDIR/{vmlinuz,initrd.img,rootfs.ext4}. About 90 s here; the
# harness (vm.sh) caches the result. MIRROR defaults to this machine's
# Debian mirror.
set -eu
OUT=${1:?usage: build-image.sh OUTDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
MIRROR=${MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)}
[ -n "$MIRROR" ] || MIRROR=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$MIRROR" ] || { echo "build-image.sh: no Debian mirror found; set MIRROR" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
R="$OUT/root.tmp"
rm -rf "$R"
trap 'rm -rf "$R"' EXIT
debootstrap --variant=minbase \
  --include=linux-image-amd64,rdma-core,ibverbs-utils,ibverbs-providers,perftest,iproute2,kmod,procps \
  bookworm "$R" "$MIRROR" >"$OUT/debootstrap.log" 2>&1 ||
  { tail -n 20 "$OUT/debootstrap.log" >&2; exit 1; }
install -m755 "$HERE/guest-init" "$R/sbin/strata-guest-init"
echo guest >"$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 guest\n' >"$R/etc/hosts"
# A small initramfs (ext4 root on virtio-blk only) boots in about 6 s.
sed -i 's/^MODULES=.*/MODULES=list/' "$R/etc/initramfs-tools/initramfs.conf"
printf 'virtio_pci\nvirtio_blk\next4\n' >>"$R/etc/initramfs-tools/modules"
chroot "$R" update-initramfs -u -k all >/dev/null
rm -rf "$R"/var/cache/apt/archives/*.deb "$R"/var/lib/apt/lists/*
# Keep only the modules the tests load (rdma_rxe needs the crc32 crypto
# modules, which modules.dep does not list).
KEEP="virtio_pci virtio_blk virtio_net ext4 9p 9pnet_virtio dummy rdma_rxe rdma_ucm ib_uverbs ib_umad crc32_generic crc32-pclmul crc32c_generic crc32c-intel"
KV=$(ls "$R/lib/modules" | head -n 1)
chroot "$R" sh -c "for m in $KEEP; do modprobe -S $KV --show-depends \$m; done" |
  awk '$1 == "insmod" {print $2}' | sort -u >"$OUT/keep.txt"
find "$R/lib/modules/$KV/kernel" -name '*.ko*' | sed "s|^$R||" | sort >"$OUT/all.txt"
comm -23 "$OUT/all.txt" "$OUT/keep.txt" | sed "s|^|$R|" | xargs rm -f
find "$R/lib/modules/$KV/kernel" -type d -empty -delete
chroot "$R" depmod -a "$KV"
rm -f "$OUT/keep.txt" "$OUT/all.txt"
cp "$R/boot/vmlinuz-$KV" "$OUT/vmlinuz"
cp "$R/boot/initrd.img-$KV" "$OUT/initrd.img"
mkfs.ext4 -q -F -L rootfs -d "$R" "$OUT/rootfs.ext4" 1G
echo "build-image.sh: $OUT ready (kernel $KV)"

#!/usr/bin/env bash
# The Soft-RoCE harness (docs/rdma.md): boots QEMU guests whose kernel gives
# a real verbs device (rxe0) and runs the project's RDMA checks in them with
# the binaries of BUILD_DIR: first one guest (rxe0 on a dummy netdev), then
# two guests joined by a link (rxe0 on each eth0, RoCE between hosts).
#
#   tests/rdma/run-vm-tests.sh BUILD_DIR
#
# The guest image is built once (tests/rdma/build-image.sh, about 90 s on an
# idle machine) and cached in $STRATA_RDMA_VM_CACHE (default
# ~/.cache/strata/rdma-vm), keyed by the build script. Without QEMU or
# debootstrap, or without root to build the image, it exits 77 (ctest:
# skipped) saying why. The last line sums up: figures, and each failed
# check with its reason (the bench check and the two-guest phase are tried
# twice on this emulated hardware; a first failure is still reported).
set -euo pipefail
BUILD="$(cd "${1:?usage: run-vm-tests.sh BUILD_DIR}" && pwd)"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
skip() { echo "SKIP: $*"; exit 77; }

command -v qemu-system-x86_64 >/dev/null || skip "no qemu-system-x86_64 (apt-get install qemu-system-x86)"
[[ -x "$BUILD/bin/strata" ]] || { echo "run-vm-tests.sh: $BUILD/bin/strata not built" >&2; exit 1; }
[[ -x "$BUILD/tests/rdma_verbs_test" ]] ||
  skip "this build has no RDMA support (STRATA_WITH_RDMA off: libibverbs-dev missing at configure time)"

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
pid_a=""
cleanup() {
  [[ -n "$pid_a" ]] && kill "$pid_a" 2>/dev/null && wait "$pid_a" 2>/dev/null
  rm -rf "$SHARE"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$SHARE/bin" "$SHARE/lib" "$SHARE/tests" "$SHARE/data"
cp "$BUILD/bin/strata" "$BUILD/bin/strata-master" "$BUILD/bin/strata-pserver" \
  "$BUILD/bin/strata-worker" "$BUILD/bin/strata-bench" "$SHARE/bin/"
cp "$ROOT/scripts/launch.sh" "$ROOT/scripts/run-daemon.sh" "$ROOT/tests/rdma/job-rdma.yaml" "$SHARE/"
cp "$BUILD/tests/rdma_device_test" "$BUILD/tests/rdma_verbs_test" "$BUILD/tests/rdma_transport_test" \
  "$SHARE/tests/"
cp "$ROOT/conf/local.yaml" "$SHARE/job.yaml"
# The one-guest job runs under mTLS (job-rdma.yaml): the certificates of
# its host, made here (the image has no OpenSSL tools), the CA's key removed.
printf '127.0.0.1 master pserver worker\n' > "$SHARE/hosts.tls"
"$ROOT/scripts/gen-certs.sh" cluster --hosts "$SHARE/hosts.tls" --out "$SHARE/tls" > /dev/null ||
  { echo "run-vm-tests: gen-certs.sh failed"; exit 1; }
rm -f "$SHARE/tls/ca/ca.key"
# The binaries' libraries, but the guest's own glibc and rdma-core (the
# guest's libibverbs finds the rxe provider).
for f in "$SHARE"/bin/* "$SHARE"/tests/*; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libibverbs|libnl-[^/]*)\.so' |
  xargs -r cp -L -t "$SHARE/lib/"
install -m755 "${STRATA_RDMA_VM_RUN_SH:-$HERE/guest-tests.sh}" "$SHARE/run.sh"

# The training job's data: the first records of Fashion-MNIST as plain IDX
# files (an emulated CPU is slow to inflate the whole set).
# idx_subset SRC.gz DST N DIMS...: the first N records of an IDX file.
idx_subset() {
  local src="$1" dst="$2" n="$3"; shift 3
  local rec=1 d magic=$((0x0801 + ($# > 0 ? 2 : 0)))
  be32() { printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)))"; }
  { be32 "$magic"; be32 "$n"; for d in "$@"; do be32 "$d"; rec=$((rec * d)); done
    (set +o pipefail; zcat "$src" | tail -c +$((9 + 4 * $#)) | head -c $((n * rec))); } >"$dst"
  [[ $(stat -c %s "$dst") -eq $((8 + 4 * $# + n * rec)) ]]
}
FMNIST="${STRATA_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}"
have_data=1
idx_subset "$FMNIST/train-images-idx3-ubyte.gz" "$SHARE/data/train-images-idx3-ubyte" 3000 28 28 &&
  idx_subset "$FMNIST/train-labels-idx1-ubyte.gz" "$SHARE/data/train-labels-idx1-ubyte" 3000 &&
  idx_subset "$FMNIST/t10k-images-idx3-ubyte.gz" "$SHARE/data/t10k-images-idx3-ubyte" 1000 28 28 &&
  idx_subset "$FMNIST/t10k-labels-idx1-ubyte.gz" "$SHARE/data/t10k-labels-idx1-ubyte" 1000 ||
  have_data=0
[[ $have_data -eq 1 ]] || { echo "run-vm-tests.sh: no Fashion-MNIST in $FMNIST (dataset-fashion-mnist)" >&2; exit 1; }
# For a developer's quicker round: STRATA_RDMA_VM_GTEST_FILTER narrows the
# guest's gtest binaries, STRATA_RDMA_VM_PHASES="1" skips the two-guest phase,
# STRATA_RDMA_VM_RUN_SH replaces the one-guest script (experiments).
if [[ -n "${STRATA_RDMA_VM_GTEST_FILTER:-}" ]]; then
  printf '%s\n' "$STRATA_RDMA_VM_GTEST_FILTER" >"$SHARE/gtest_filter"
fi
phases="${STRATA_RDMA_VM_PHASES:-1 2}"

# boot SHARE LOG SMP MEM APPEND... -- QEMU_ARGS...: one guest, until it powers off.
boot() {
  local share="$1" log="$2" smp="$3" mem="$4"; shift 4
  local append=()
  while [[ $# -gt 0 && "$1" != -- ]]; do append+=("$1"); shift; done
  shift || true
  # The guest sets its clock from this (an emulated guest's clock lags,
  # and the certificates of /share/tls are only as old as this run).
  date -u +%s > "$share/now"
  timeout "${STRATA_RDMA_VM_TIMEOUT:-1500}" qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu max -smp "$smp" -m "$mem" -nographic -no-reboot \
    -kernel "$IMG/vmlinuz" -initrd "$IMG/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 net.ifnames=0 init=/sbin/strata-guest-init panic=-1 quiet loglevel=3 ${append[*]}" \
    -drive file="$IMG/rootfs.ext4",format=raw,if=virtio,cache=unsafe,snapshot=on \
    -virtfs local,path="$share",mount_tag=share,security_model=none,id=share \
    "$@" </dev/null >"$log" 2>&1
}

# verdict NAME SHARE QEMU_RC SECONDS: prints the guest's log; true when all
# passed. A failure also goes into $problems, which the last line carries
# (CI shows the head and the tail of a long log, not the middle).
problems=""
verdict() {
  local name="$1" share="$2" rc="$3" secs="$4" guest_rc what
  [[ -f "$share/guest.log" ]] && cat "$share/guest.log"
  guest_rc="$(cat "$share/run.rc" 2>/dev/null || echo none)"
  echo "run-vm-tests.sh: $name: qemu exit $rc, guest checks exit $guest_rc, $secs s"
  if [[ $rc -ne 0 || "$guest_rc" != 0 ]]; then
    echo "--- $name console (last 30 lines):"
    tail -n 30 "$share/console.log"
    if [[ $rc -eq 124 ]]; then
      # The check that was running: the last one started without a verdict.
      what="$(sed -n 's/^=== \(.*\)$/\1/p' "$share/guest.log" 2>/dev/null | tail -n 1)"
      case "$what" in *": PASS ("*|*": FAIL ("*|"") what="between checks" ;; *) what="in '$what'" ;; esac
      what="timed out after $secs s $what (STRATA_RDMA_VM_TIMEOUT=${STRATA_RDMA_VM_TIMEOUT:-1500})"
    else
      # Each failed check with the last lines of its output.
      what="$(sed -n 's/^=== \(.*\): FAIL (.*$/\1/p; s/^=== why: /  why: /p' "$share/guest.log" 2>/dev/null |
              paste -sd' ' -)"
      what="qemu exit $rc, failed: ${what:-none named (guest exit $guest_rc)}"
    fi
    problems="$problems; $name: $what"
    what="$(sed -n 's/^=== retried: //p' "$share/guest.log" 2>/dev/null | paste -sd' ' -)"
    [[ -z "$what" ]] || problems="$problems (and $what)"
    return 1
  fi
  # A check that passed only on its second try is reported all the same.
  what="$(sed -n 's/^=== retried: //p' "$share/guest.log" 2>/dev/null | paste -sd' ' -)"
  [[ -z "$what" ]] || problems="$problems; $name passed, but $what"
}

failed=0
start=$SECONDS

# 1. One guest, rxe0 on a dummy netdev: the device, the verbs layer.
if [[ " $phases " == *" 1 "* ]]; then
echo "run-vm-tests.sh: one guest (QEMU TCG, 2 vCPUs)"
rc=0 t0=$SECONDS
boot "$SHARE" "$SHARE/console.log" 2 2048 -- -nic none || rc=$?
verdict "one guest" "$SHARE" "$rc" $((SECONDS - t0)) || failed=1
fi

# 2. Two guests joined by a link (a QEMU UDP socket pair on 127.0.0.1), rxe0
# on each one's eth0: RoCE between hosts.
# The link is emulated (UDP between two emulated CPUs): a failed pair is
# booted once more, and the first failure reported all the same.
pair() {  # TRY: boots both guests; true when both passed
  local try="$1" rc_a=0 rc_b=0 t0=$SECONDS port=$((20000 + RANDOM % 20000)) g ok=0
  for g in a b; do
    rm -rf "$SHARE/$g"
    mkdir -p "$SHARE/$g"
    cp -al "$SHARE/bin" "$SHARE/lib" "$SHARE/data" "$SHARE/$g/"
    # (In plain text: on one emulated vCPU a TLS handshake outlasts the
    # control channel's 1 s connection attempt, so a node never registers;
    # the one-guest job runs under mTLS.)
    sed 's/^  mode: mtls .*/  mode: plaintext/' "$SHARE/job-rdma.yaml" > "$SHARE/$g/job-rdma.yaml"
    install -m755 "$HERE/guest-pair.sh" "$SHARE/$g/run.sh"
  done
  boot "$SHARE/a" "$SHARE/a/console.log" 1 1024 role=a -- \
    -netdev "socket,id=n0,udp=127.0.0.1:$((port + 1)),localaddr=127.0.0.1:$port" \
    -device virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01 &
  pid_a=$!
  boot "$SHARE/b" "$SHARE/b/console.log" 1 1024 role=b -- \
    -netdev "socket,id=n0,udp=127.0.0.1:$port,localaddr=127.0.0.1:$((port + 1))" \
    -device virtio-net-pci,netdev=n0,mac=52:54:00:00:00:02 || rc_b=$?
  wait "$pid_a" || rc_a=$?
  pid_a=""
  verdict "guest a$try" "$SHARE/a" "$rc_a" $((SECONDS - t0)) || ok=1
  verdict "guest b$try" "$SHARE/b" "$rc_b" $((SECONDS - t0)) || ok=1
  return $ok
}
if [[ " $phases " == *" 2 "* ]]; then
  echo "run-vm-tests.sh: two guests linked over 127.0.0.1 UDP (1 vCPU each)"
  if ! pair ""; then
    echo "run-vm-tests.sh: the two guests failed; once more"
    first="$problems"
    problems=""
    if pair " (second try)"; then
      problems="$first; the two guests passed on a second try"
    else
      problems="$first$problems"
      failed=1
    fi
  fi
fi

# The line scripts/test.sh shows after the ctest summary.
bw="$(sed -n 's/^ib_write_bw 1 MiB between guests: /, ib_write_bw between the guests /p' \
      "$SHARE/b/guest.log" 2>/dev/null | head -n 1 || true)"
ratio="$(sed -n 's/^rdma bench 4 MiB: .*ratio \([0-9.]*\)$/, 4 MiB push-then-pull over rdma at \1 of ib_write_bw on rxe0/p' \
      "$SHARE/guest.log" 2>/dev/null | head -n 1 || true)"
if [[ $failed -eq 0 ]]; then verdict=passed; else verdict=FAILED; fi
echo "run-vm-tests.sh: all phases $verdict, $((SECONDS - start)) s$ratio$bw$problems"
exit "$failed"

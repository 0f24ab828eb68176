#!/usr/bin/env bash
# Checkpoint write and restore throughput to a real radosgw (docs/performance.md):
# strata-s3-bench writes partition files through the checkpoint writer and
# the object-store backend (parallel multipart) and reads them back through
# the checkpoint reader (parallel ranged GETs, checksums checked); s3cmd
# puts and gets the same bytes to the same radosgw. Two rounds, the order
# swapped in the second, the best of each; ratios > 1 mean Strata is faster.
#
#   bench/s3_bench.sh [BUILD_DIR] [--files N] [--mb M] [--parallel P] [--part-mb S]
#
# Brings up its own single-node Ceph (tests/storage/ceph/ceph.sh) in a
# temporary directory on ports 18480.., and takes it down after.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build"
if [[ $# -gt 0 && "$1" != --* ]]; then BUILD="$1"; shift; fi
FILES=4 MB=64 PARALLEL=8 PART_MB=8
while [[ $# -gt 0 ]]; do
  case "$1" in
    --files) FILES="$2"; shift 2 ;;
    --mb) MB="$2"; shift 2 ;;
    --parallel) PARALLEL="$2"; shift 2 ;;
    --part-mb) PART_MB="$2"; shift 2 ;;
    *) echo "s3_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v s3cmd >/dev/null || { echo "s3_bench.sh: s3cmd is not installed (apt-get install s3cmd)" >&2; exit 1; }
work="$(mktemp -d /tmp/strata-s3-bench-XXXXXX)"
trap '"$ROOT/tests/storage/ceph/ceph.sh" down "$work/ceph" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
"$ROOT/tests/storage/ceph/ceph.sh" up "$work/ceph" 18480 > "$work/ceph.log" 2>&1 ||
  { cat "$work/ceph.log"; exit 1; }
source "$work/ceph/env"
s3() { s3cmd -c "$S3CMD_CONFIG" --no-progress "$@"; }
s3 mb s3://bench > /dev/null
cat > "$work/bench.yaml" <<YAML
data:
  train_images: /dev/null
  train_labels: /dev/null
  test_images: /dev/null
  test_labels: /dev/null
s3:
  endpoint: $S3_ENDPOINT
  credentials_file: $S3_CREDENTIALS
  part_size_mb: $PART_MB
  parallel_parts: $PARALLEL
YAML
field() { sed -n "s/.*\"$1\": \\([0-9.]*\\).*/\\1/p"; }
now() { date +%s.%N; }
mkdir -p "$work/local"
best_sw=0 best_sr=0 best_cw=0 best_cr=0
strata_round() {  # strata_round R
  local out
  out="$("$BUILD/bin/strata-s3-bench" --config "$work/bench.yaml" --root "s3://bench/strata-$1" \
         --files "$FILES" --mb "$MB")"
  echo "  strata: $out"
  bytes="$(echo "$out" | field bytes)"
  local w r; w="$(echo "$out" | field write_mb_per_s)"; r="$(echo "$out" | field read_mb_per_s)"
  best_sw="$(echo "$w $best_sw" | awk '{print ($1 > $2) ? $1 : $2}')"
  best_sr="$(echo "$r $best_sr" | awk '{print ($1 > $2) ? $1 : $2}')"
}
s3cmd_round() {  # s3cmd_round R: put the local copies, get them back
  local t0 t1 t2 w r
  rm -rf "$work/got"; mkdir -p "$work/got"
  t0="$(now)"
  s3 put "$work"/local/*.blk "s3://bench/s3cmd-$1/" > /dev/null
  t1="$(now)"
  s3 get "s3://bench/s3cmd-$1/"* "$work/got/" > /dev/null
  t2="$(now)"
  w="$(echo "$bytes $t0 $t1" | awk '{printf "%.1f", $1 / 1e6 / ($3 - $2)}')"
  r="$(echo "$bytes $t1 $t2" | awk '{printf "%.1f", $1 / 1e6 / ($3 - $2)}')"
  echo "  s3cmd:  put ${w} MB/s, get ${r} MB/s"
  best_cw="$(echo "$w $best_cw" | awk '{print ($1 > $2) ? $1 : $2}')"
  best_cr="$(echo "$r $best_cr" | awk '{print ($1 > $2) ? $1 : $2}')"
}
echo "round 1 (strata first)"
strata_round 1
s3 get "s3://bench/strata-1/"* "$work/local/" > /dev/null  # the same bytes, for s3cmd put
s3cmd_round 1
echo "round 2 (s3cmd first)"
s3cmd_round 2
strata_round 2
echo
printf '%-28s %10s %10s %7s\n' "$FILES x $MB MB files" "strata" "s3cmd" ratio
printf '%-28s %10s %10s %7s\n' "checkpoint write MB/s" "$best_sw" "$best_cw" \
  "$(echo "$best_sw $best_cw" | awk '{printf "%.2f", $1 / $2}')"
printf '%-28s %10s %10s %7s\n' "restore read MB/s" "$best_sr" "$best_cr" \
  "$(echo "$best_sr $best_cr" | awk '{printf "%.2f", $1 / $2}')"
echo "(part size $PART_MB MB, $PARALLEL parts in flight; radosgw on a bluestore OSD on a file, 127.0.0.1)"

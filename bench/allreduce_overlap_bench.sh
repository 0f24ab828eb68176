#!/usr/bin/env bash
# Dense allreduce overlapping the backward pass, across hosts on shaped
# links (docs/performance.md, "Dense tables by allreduce"): hosts are
# network namespaces on a bridge (as the multi-host tests make them); the
# master and the pserver on host 1, one worker on each of hosts 2 and 3,
# whose links tc tbf shapes to RATE Mbit/s each way. A bsp MLP (784-1024-
# 256-10 on Fashion-MNIST, batch BATCH per worker, TCP, its dense tables by
# the workers' ring: model.dense_sync allreduce) runs for about STEPS steps
# with the ring's step after the backward pass (model.allreduce_bucket_kib
# 0, "whole") and with buckets that go round as the backward pass makes
# them (the default), alternated ROUNDS times; samples/s of each and the
# median of the buckets/whole ratios.
#   bench/allreduce_overlap_bench.sh [BUILD_DIR] [--rate MBIT] [--batch B] [--steps N]
#                                    [--rounds R] [--bucket-kib K]
# Needs root (namespaces, tc).
set -euo pipefail
BUILD_DIR="$(cd "${1:-build}" && pwd)"; shift || true
rate=1000 batch=256 steps=150 rounds=3 bucket_kib=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rate) rate="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --bucket-kib) bucket_kib="$2"; shift 2 ;;
    *) echo "allreduce_overlap_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
source "$(dirname "$0")/../tests/e2e/lib.sh"
source "$ROOT/tests/ops/hosts_lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || { echo "dataset-fashion-mnist not installed" >&2; exit 2; }
bridge=strata-aob subnet=10.213.78 veth=aob
hosts=(1 2 3)  # 1: master and pserver; 2, 3: a worker each
ns_of() { echo "strata-aob-$1"; }
work="$(mktemp -d /tmp/strata-overlap-XXXXXX)"
trap 'set +e; remove_hosts; [[ -n "${KEEP_WORK:-}" ]] || rm -rf "$work"' EXIT
set +e; remove_hosts; set -e  # (a run killed before left them)
make_hosts
for h in 2 3; do shape_link "$h" "$rate" 256kb; done
write_ns_exec "$work/ns-exec"
printf '%s master pserver=1\n%s worker=1\n%s worker=1\n' "$(addr_of 1)" "$(addr_of 2)" \
  "$(addr_of 3)" > "$work/hosts"

run() {  # run NAME BUCKET_LINE -> samples/s, test accuracy
  local name="$1" extra="$2" job="$work/$1.yaml"
  write_config "$job" bsp 1 "$(pick_port_base)" $(( steps * batch * 2 )) 4096
  sed -i "s/^  batch_size: 64\$/  batch_size: $batch/; s/^  progress_every_steps: 100\$/  progress_every_steps: 1000000/" "$job"
  sed -i "s/^  layers: \[784, 128, 10\]\$/  layers: [784, 1024, 256, 10]\n  dense_sync: allreduce$extra/" "$job"
  grep -q "dense_sync: allreduce" "$job" || { echo "allreduce_overlap_bench.sh: cannot make $job" >&2; exit 1; }
  rm -rf "$work/run-$name"
  "$ROOT/scripts/launch.sh" run --config "$job" --hosts "$work/hosts" --run-dir "$work/run-$name" \
    --bin-dir "$BUILD_DIR/bin" --remote-all --remote-cmd "$work/ns-exec" --quiet --timeout 900 \
    > "$work/run-$name.out" 2>&1 || { tail -n 30 "$work/run-$name.out" >&2; exit 1; }
  /usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print('%.0f %.4f' % (s['samples_per_sec'], s['final_test_accuracy']))" \
    "$work/run-$name/summary.json"
}
median() { tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

echo "2 worker hosts on ${rate} Mbit/s links, MLP 784-1024-256-10, batch $batch a worker, ~$steps steps"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
ratios=() whole=() buckets=()
for ((i = 1; i <= rounds; i++)); do
  read -r w qw < <(run whole "\\n  allreduce_bucket_kib: 0")
  read -r b qb < <(run buckets "${bucket_kib:+\\n  allreduce_bucket_kib: $bucket_kib}")
  ratio="$(awk -v a="$b" -v b="$w" 'BEGIN {printf "%.3f", a / b}')"
  printf '  round %d: whole %7.0f samples/s (test %s) | buckets %7.0f samples/s (test %s) | ratio %s\n' \
    "$i" "$w" "$qw" "$b" "$qb" "$ratio"
  ratios+=("$ratio") whole+=("$w") buckets+=("$b")
done
printf '  median: whole %.0f, buckets %.0f samples/s, buckets/whole %s\n' \
  "$(echo "${whole[*]}" | median)" "$(echo "${buckets[*]}" | median)" "$(echo "${ratios[*]}" | median)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

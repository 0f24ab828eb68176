#!/usr/bin/env bash
# Dense tables by allreduce among the workers against dense tables on the
# pservers (model.dense_sync: allreduce vs ps, docs/performance.md "Dense
# tables by allreduce"), the same job alternated in one session, 2 workers
# and 2 pservers (conf/hosts.local), bsp:
#
#   mlp  conf/local.yaml (the Fashion-MNIST MLP 784-256-128-10, mTLS),
#        batch 64 per worker, without its checkpoints;
#   ctr  conf/ctr.yaml in bsp (Wide & Deep, hidden [64, 32], batch 256 per
#        worker), without its checkpoints: the dense tables by allreduce,
#        the sparse ones on the pservers either way.
#
# Each round runs three jobs: ps; allreduce with model.allreduce_bucket_kib
# 0 (the ring's step after the backward pass, "whole"); allreduce with
# buckets overlapping the backward pass (model.allreduce_bucket_kib as
# --bucket-kib says, or its default).
#
#   bench/dense_sync_bench.sh [--pairs N] [--epochs E] [--ctr-rows R] [--only mlp|ctr]
#                             [--bucket-kib K]   (the buckets' size; default: the config's)
#
# Built binaries are taken from build/bin. Prints each run's samples/s
# (summary.json) and test accuracy or AUC, and per workload the median of
# the allreduce/ps ratios; the load average first and last (a 2-core VM is
# noisy: say what else ran).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/bench/lib.sh"
BIN="$ROOT/build/bin"
PAIRS=3
EPOCHS=2
CTR_ROWS=200000
ONLY=""
BUCKET_KIB=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --pairs) PAIRS="$2"; shift 2 ;;
    --epochs) EPOCHS="$2"; shift 2 ;;
    --ctr-rows) CTR_ROWS="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --bucket-kib) BUCKET_KIB="$2"; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "dense_sync_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for b in strata-master strata-pserver strata-worker; do
  [[ -x "$BIN/$b" ]] || { echo "dense_sync_bench.sh: $BIN/$b not built (scripts/build.sh)" >&2; exit 1; }
done

WORK="$(mktemp -d /tmp/strata-dense-sync-bench.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

# The MLP: conf/local.yaml with EPOCHS epochs, quiet progress, no
# checkpoints (allreduce tables have none yet).
sed -E -e "s/^(  epochs:) *[0-9]+/\1 $EPOCHS/" -e "s/^(  progress_every_steps:) *[0-9]+/\1 1000000/" \
  "$ROOT/conf/local.yaml" | sed '/^checkpoint:/,/^$/d' > "$WORK/mlp-ps.yaml"
# The CTR job: bsp, one epoch of CTR_ROWS generated rows, no checkpoints.
sed -E -e "s/^(  consistency:) *asp/\1 bsp/" -e "s/^(  epochs:) *[0-9]+/\1 1/" \
  -e "s/^(  progress_every_steps:) *[0-9]+/\1 1000000/" \
  -e "s/^(    train_rows:) *[0-9]+/\1 $CTR_ROWS/" -e "s/^(    test_rows:) *[0-9]+/\1 20000/" \
  -e "s#/tmp/strata-ctr#$WORK/ctr-data#g" "$ROOT/conf/ctr.yaml" |
  sed '/^checkpoint:/,/^$/d' > "$WORK/ctr-ps.yaml"
for w in mlp ctr; do
  grep -q "^  activation: relu$" "$WORK/$w-ps.yaml" ||
    { echo "dense_sync_bench.sh: no model.activation in $WORK/$w-ps.yaml" >&2; exit 1; }
  sed "s/^  activation: relu\$/  activation: relu\n  dense_sync: allreduce${BUCKET_KIB:+\\n  allreduce_bucket_kib: $BUCKET_KIB}/" \
    "$WORK/$w-ps.yaml" > "$WORK/$w-allreduce.yaml"
  sed 's/^  activation: relu$/  activation: relu\n  dense_sync: allreduce\n  allreduce_bucket_kib: 0/' \
    "$WORK/$w-ps.yaml" > "$WORK/$w-whole.yaml"
done
grep -q "consistency: bsp" "$WORK/ctr-ps.yaml" && ! grep -q "^checkpoint:" "$WORK"/*-ps.yaml ||
  { echo "dense_sync_bench.sh: cannot make the configs" >&2; exit 1; }

json_field() {  # file key
  sed -nE "s/^ *\"$2\": ([0-9.eE+-]+),?$/\1/p" "$1" | head -1
}
run() {  # config -> "samples_per_sec quality"
  local dir="$WORK/run-$RANDOM"
  "$ROOT/scripts/launch.sh" run --config "$1" --hosts "$ROOT/conf/hosts.local" \
    --run-dir "$dir" --bin-dir "$BIN" --quiet >"$WORK/launch.log" 2>&1 ||
    { tail -20 "$WORK/launch.log" >&2; echo "dense_sync_bench.sh: run of $1 failed" >&2; exit 1; }
  local q
  q="$(json_field "$dir/summary.json" final_test_auc)"
  [[ -n "$q" ]] || q="$(json_field "$dir/summary.json" final_test_accuracy)"
  echo "$(json_field "$dir/summary.json" samples_per_sec) $q"
  rm -rf "$dir"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
for w in mlp ctr; do
  [[ -z "$ONLY" || "$ONLY" == "$w" ]] || continue
  echo "$w: dense by allreduce vs by the pservers (bsp, 2 workers, 2 pservers)"
  RATIOS=() OVERLAP=() PS=() WH=() AR=()
  for ((i = 1; i <= PAIRS; i++)); do
    read -r ps qps < <(run "$WORK/$w-ps.yaml")
    read -r wh qwh < <(run "$WORK/$w-whole.yaml")
    read -r ar qar < <(run "$WORK/$w-allreduce.yaml")
    ratio="$(awk -v a="$ar" -v b="$ps" 'BEGIN {printf "%.3f", a / b}')"
    overlap="$(awk -v a="$ar" -v b="$wh" 'BEGIN {printf "%.3f", a / b}')"
    printf '  round %d: ps %8.0f (test %s) | whole %8.0f (test %s) | buckets %8.0f (test %s) samples/s | buckets/ps %s, buckets/whole %s\n' \
      "$i" "$ps" "$qps" "$wh" "$qwh" "$ar" "$qar" "$ratio" "$overlap"
    RATIOS+=("$ratio") OVERLAP+=("$overlap") PS+=("$ps") WH+=("$wh") AR+=("$ar")
  done
  printf '  median: ps %.0f, whole %.0f, buckets %.0f samples/s; buckets/ps %s, buckets/whole %s\n' \
    "$(echo "${PS[*]}" | median)" "$(echo "${WH[*]}" | median)" "$(echo "${AR[*]}" | median)" \
    "$(echo "${RATIOS[*]}" | median)" "$(echo "${OVERLAP[*]}" | median)"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

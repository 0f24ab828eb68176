#!/usr/bin/env bash
# The DLRM example (examples/torch/ctr_dlrm.py, conf/torch-dlrm.yaml: 2
# pservers, 2 script workers, asp, batch 256 each, on conf/ctr.yaml's data)
# against the same model trained by one PyTorch process alone on the same
# cores (bench/dlrm_alone.py: nn.EmbeddingBag with sparse gradients, 2
# threads), alternated in one session (docs/performance.md, issue 25).
#
#   bench/dlrm_bench.sh [--pairs N] [--epochs E]
#
# The data set is generated first when missing (data.generate). Prints
# samples/s and test AUC of every run, the medians and the ratio
# strata/alone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/bench/lib.sh"
PAIRS=2
EPOCHS=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --pairs) PAIRS="$2"; shift 2 ;;
    --epochs) EPOCHS="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "dlrm_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
WORK="$(mktemp -d /tmp/strata-dlrm-bench.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
sed -E -e "s/^(  epochs:) *[0-9]+/\1 $EPOCHS/" \
  -e "s/^(  progress_every_steps:) *[0-9]+/\1 1000000/" \
  -e "s|examples/torch/ctr_dlrm.py|$ROOT/examples/torch/ctr_dlrm.py|" \
  "$ROOT/conf/torch-dlrm.yaml" >"$WORK/dlrm.yaml"
train="$(sed -nE 's/^  train: (.*)$/\1/p' "$WORK/dlrm.yaml")"
test="$(sed -nE 's/^  test: (.*)$/\1/p' "$WORK/dlrm.yaml")"
field() { sed -nE "s/.*\"$2\": ([0-9.eE+-]+).*/\1/p" "$1" | head -1; }

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $EPOCHS epoch(s)"
ST=() AL=() R=()
for ((i = 1; i <= PAIRS; i++)); do
  dir="$WORK/run-$i"
  "$ROOT/scripts/launch.sh" run --config "$WORK/dlrm.yaml" --hosts "$ROOT/conf/hosts.local" \
    --run-dir "$dir" --quiet >"$WORK/launch.log" 2>&1 ||
    { cat "$WORK/launch.log" >&2; echo "dlrm_bench.sh: cluster run failed" >&2; exit 1; }
  st="$(field "$dir/summary.json" samples_per_sec)"
  st_auc="$(field "$dir/summary.json" final_test_auc)"
  /usr/bin/python3 "$ROOT/bench/dlrm_alone.py" --train "$train" --test "$test" \
    --epochs "$EPOCHS" --threads 2 >"$WORK/alone.json"
  al="$(field "$WORK/alone.json" samples_per_sec)"
  al_auc="$(field "$WORK/alone.json" test_auc)"
  r="$(awk -v a="$st" -v b="$al" 'BEGIN {printf "%.3f", a / b}')"
  printf '  round %d: strata %8.0f samples/s (AUC %.4f) | alone %8.0f samples/s (AUC %.4f) | ratio %s\n' \
    "$i" "$st" "$st_auc" "$al" "$al_auc" "$r"
  ST+=("$st") AL+=("$al") R+=("$r")
done
printf '  median: strata %.0f, alone %.0f samples/s; strata/alone %s\n' \
  "$(echo "${ST[*]}" | median)" "$(echo "${AL[*]}" | median)" "$(echo "${R[*]}" | median)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# Pipeline stages of a PyTorch nn.Sequential (job.pipeline; docs/python.md,
# "Pipeline stages") against the same model unpipelined, alternated in one
# session (docs/performance.md, issue 28):
#
#   py2   `scripts/launch.sh run` of conf/torch-pipeline.yaml: the README's
#         MLP (784-256-128-10) as an nn.Sequential in 2 stages on 2 Python
#         workers (examples/torch/fmnist_pipeline.py), 8 micro-batches of
#         batch 64, 2 pservers;
#   cpp2  the same job with C++ workers (worker.command removed): the MLP
#         trainer's stages;
#   py1   the same script and job in 1 stage on 1 worker (model.stages 1:
#         pipe.step() is backward() and step() on the whole batch).
#
#   bench/torch_pipeline_bench.sh [--rounds N] [--epochs E]
#
# Prints samples/s of every run (summary.json's samples_per_sec), the
# medians and the ratios py2/py1 and py2/cpp2, and the 1F1B schedule's
# bubble, (K - 1) / (M + K - 1). Needs Debian's python3-torch and the build
# in build/ (with the Python package).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/bench/lib.sh"
ROUNDS=3
EPOCHS=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --epochs) EPOCHS="$2"; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "torch_pipeline_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
torch_bench_needs torch_pipeline_bench.sh

WORK="$(mktemp -d /tmp/strata-torch-pipeline-bench.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
sed -E -e "s/^(  epochs:) *[0-9]+/\1 $EPOCHS/" \
  -e "s/^(  progress_every_steps:) *[0-9]+/\1 1000000/" \
  -e "s|examples/torch/fmnist_pipeline.py|$ROOT/examples/torch/fmnist_pipeline.py|" \
  -e "s|^(  dir: ).*|\1$WORK/ckpt|" \
  "$ROOT/conf/torch-pipeline.yaml" >"$WORK/py2.yaml"
sed -E '/^  command:/d' "$WORK/py2.yaml" >"$WORK/cpp2.yaml"
sed -E -e 's/^(  stages:) *[0-9]+.*/\1 1/' -e '/^  micro_batches:/d' "$WORK/py2.yaml" >"$WORK/py1.yaml"
grep -q '^  stages: 1$' "$WORK/py1.yaml" ||
  { echo "torch_pipeline_bench.sh: no model.stages in conf/torch-pipeline.yaml" >&2; exit 1; }
printf '127.0.0.1 master pserver=2 worker=2\n' >"$WORK/hosts2"
printf '127.0.0.1 master pserver=2 worker=1\n' >"$WORK/hosts1"
MICRO="$(sed -nE 's/^  micro_batches: *([0-9]+).*/\1/p' "$WORK/py2.yaml")"

cluster() {  # config hosts -> samples_per_sec
  launch_samples_per_sec torch_pipeline_bench.sh "$1" "$2" "$WORK"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $EPOCHS epochs;" \
  "bubble of 2 stages, $MICRO micro-batches (1F1B): $(awk -v m="$MICRO" 'BEGIN {printf "%.3f", 1 / (m + 1)}')"
P2=() C2=() P1=() R1=() RC=()
for ((i = 1; i <= ROUNDS; i++)); do
  p2="$(cluster "$WORK/py2.yaml" "$WORK/hosts2")"
  c2="$(cluster "$WORK/cpp2.yaml" "$WORK/hosts2")"
  p1="$(cluster "$WORK/py1.yaml" "$WORK/hosts1")"
  r1="$(awk -v a="$p2" -v b="$p1" 'BEGIN {printf "%.3f", a / b}')"
  rc="$(awk -v a="$p2" -v b="$c2" 'BEGIN {printf "%.3f", a / b}')"
  printf '  round %d: python 2 stages %8.0f | c++ 2 stages %8.0f | python 1 stage %8.0f samples/s | py2/py1 %s py2/cpp2 %s\n' \
    "$i" "$p2" "$c2" "$p1" "$r1" "$rc"
  P2+=("$p2") C2+=("$c2") P1+=("$p1") R1+=("$r1") RC+=("$rc")
done
printf '  median: python 2 stages %.0f, c++ 2 stages %.0f, python 1 stage %.0f samples/s; py2/py1 %s, py2/cpp2 %s\n' \
  "$(echo "${P2[*]}" | median)" "$(echo "${C2[*]}" | median)" "$(echo "${P1[*]}" | median)" \
  "$(echo "${R1[*]}" | median)" "$(echo "${RC[*]}" | median)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

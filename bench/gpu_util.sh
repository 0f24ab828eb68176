#!/usr/bin/env bash
# GPU utilisation of a training run (docs/gpu.md): the Fashion-MNIST MLP of
# conf/local.yaml (wider: 784-2048-2048-10, batch 512) trained by real
# daemons through scripts/launch.sh, one pserver beside one worker on the
# GPU (worker.device: cuda), while nvidia-smi samples the share of time in
# which a kernel ran (utilization.gpu, every 100 ms). Prints the mean over
# the samples taken while the job trained. Needs a GPU and nvidia-smi; says
# so and exits 1 without them.
#
#   bench/gpu_util.sh [BUILD_DIR] [--precision fp32|tf32|bf16] [--epochs N]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build"
if [[ $# -gt 0 && "$1" != --* ]]; then BUILD="$1"; shift; fi
PRECISION=tf32 EPOCHS=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --precision) PRECISION="$2"; shift 2 ;;
    --epochs) EPOCHS="$2"; shift 2 ;;
    *) echo "gpu_util.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v nvidia-smi >/dev/null || { echo "gpu_util.sh: no nvidia-smi (no GPU driver here)" >&2; exit 1; }
work="$(mktemp -d /tmp/strata-gpu-util-XXXXXX)"
trap 'kill "${smi:-}" 2>/dev/null || true; pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
sed -e "s/^  epochs: .*/  epochs: $EPOCHS/" -e 's/^  batch_size: .*/  batch_size: 512/' \
    -e 's/^  layers: .*/  layers: [784, 2048, 2048, 10]/' -e '/^checkpoint:/,/^$/d' \
    -e 's/^  slice_bytes: .*/  slice_bytes: 4194304/' "$ROOT/conf/local.yaml" > "$work/job.yaml"
printf 'worker:\n  device: cuda\n  precision: %s\n' "$PRECISION" >> "$work/job.yaml"
printf '127.0.0.1 master pserver=1 worker=1\n' > "$work/hosts"
nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 100 \
  > "$work/smi.csv" &
smi=$!
"$ROOT/scripts/launch.sh" run --config "$work/job.yaml" --hosts "$work/hosts" \
  --run-dir "$work/run" --bin-dir "$BUILD/bin" --timeout 1800 > "$work/out" 2>&1 ||
  { tail -n 20 "$work/out"; echo "gpu_util.sh: the run failed" >&2; exit 1; }
kill "$smi" 2>/dev/null || true
grep -m1 'device: cuda' "$work/run/logs/worker-0.log" | sed 's/.*\] /worker: /'
# The samples between the worker's first and last progress lines.
first="$(grep -m1 'progress: worker' "$work/run/logs/worker-0.log" | awk '{print $2}')"
last="$(grep 'progress: worker' "$work/run/logs/worker-0.log" | tail -n 1 | awk '{print $2}')"
awk -F', ' -v a="$first" -v b="$last" '
  { split($1, t, " "); tm = t[2] } tm >= a && tm <= b { s += $2; n++ }
  END { if (n == 0) { print "gpu_util.sh: no samples while training"; exit 1 }
        printf "GPU utilisation while training: %.2f (mean of %d samples of nvidia-smi utilization.gpu)\n", s / n / 100, n }' \
  "$work/smi.csv"
grep -E '"(samples_per_sec|final_test_accuracy)"' "$work/run/summary.json" | sed 's/^ */summary: /'

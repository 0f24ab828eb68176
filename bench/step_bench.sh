#!/usr/bin/env bash
# One training step (forward and backward, no network) of the MLP and of
# the Wide & Deep CTR model on a Strata device against the same model in
# PyTorch on the same device, alternated three times, best of each, reported
# as a ratio (docs/gpu.md):
#
#   bench/step_bench.sh [BUILD_DIR] [--device cpu|cuda] [--precision fp32|tf32|bf16]
#
# A ratio under 1 means Strata's step is faster. On the CPU both use one
# thread. PyTorch comes from Debian's python3-torch (/usr/bin/python3); the
# script says so and stops when it is missing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build"
if [[ $# -gt 0 && "$1" != --* ]]; then BUILD="$1"; shift; fi
DEVICE=cpu PRECISION=fp32
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --precision) PRECISION="$2"; shift 2 ;;
    *) echo "step_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
PY=/usr/bin/python3
"$PY" -c 'import torch' 2>/dev/null ||
  { echo "step_bench.sh: no PyTorch for $PY (apt-get install python3-torch)" >&2; exit 1; }
field() { sed -n "s/.*\"$1\": \\([0-9.]*\\).*/\\1/p"; }
# CASE "model layers batch": the Fashion-MNIST MLP of conf/local.yaml, two
# wider ones; the CTR model of conf/ctr.yaml (hidden 64,32; embedding 8)
# and a wider one. (layers: the MLP's widths; the CTR model's hidden ones.)
printf '%-10s %-22s %6s %12s %12s %7s\n' model layers batch "strata ms" "torch ms" ratio
for case in "mlp 784,256,128,10 64" "mlp 784,1024,1024,10 256" "mlp 1024,4096,4096,1024 512" \
            "wide_deep 64,32 512" "wide_deep 512,256 2048"; do
  read -r model layers batch <<<"$case"
  best_s="" best_t=""
  for _ in 1 2 3; do
    emb=""; [[ $model == wide_deep ]] && emb="--embedding_dim 8"
    s="$("$BUILD/bin/strata-step-bench" --model "$model" --device "$DEVICE" $emb \
         --precision "$PRECISION" --layers "$layers" --batch "$batch" --steps 20 | field ms_per_step)"
    t="$("$PY" "$ROOT/bench/torch_step.py" --model "$model" --device "$DEVICE" $emb \
         --precision "$PRECISION" --layers "$layers" --batch "$batch" --steps 20 | field ms_per_step)"
    best_s="$(awk -v a="${best_s:-1e99}" -v b="$s" 'BEGIN {print (b < a ? b : a)}')"
    best_t="$(awk -v a="${best_t:-1e99}" -v b="$t" 'BEGIN {print (b < a ? b : a)}')"
  done
  awk -v m="$model" -v l="$layers" -v b="$batch" -v s="$best_s" -v t="$best_t" \
    'BEGIN {printf "%-10s %-22s %6d %12.3f %12.3f %7.2f\n", m, l, b, s, t, s / t}'
done

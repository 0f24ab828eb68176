#!/usr/bin/env bash
# The README's MLP written in PyTorch, trained through Strata by script
# workers, against its baselines, alternated in one session
# (docs/performance.md, issue 25):
#
#   py    `scripts/launch.sh run` of conf/torch.yaml: 2 pservers, 2 Python
#         workers (examples/torch/fmnist_mlp.py), bsp, batch 64 each;
#   cpp   the same job with C++ workers (worker.command removed);
#   ddp   PyTorch DDP (gloo, 2 processes of 1 thread, batch 64 each, the
#         same model; bench/ddp_baseline.py).
#
#   bench/torch_worker_bench.sh [--pairs N] [--epochs E]
#
# Prints samples/s of every run (summary.json's samples_per_sec for the
# clusters), the medians and the ratios py/ddp and py/cpp. Needs Debian's
# python3-torch and the build in build/ (with the Python package).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/bench/lib.sh"
PAIRS=3
EPOCHS=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --pairs) PAIRS="$2"; shift 2 ;;
    --epochs) EPOCHS="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "torch_worker_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
torch_bench_needs torch_worker_bench.sh

WORK="$(mktemp -d /tmp/strata-torch-bench.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
sed -E -e "s/^(  epochs:) *[0-9]+/\1 $EPOCHS/" \
  -e "s/^(  progress_every_steps:) *[0-9]+/\1 1000000/" \
  -e "s|examples/torch/fmnist_mlp.py|$ROOT/examples/torch/fmnist_mlp.py|" \
  "$ROOT/conf/torch.yaml" >"$WORK/py.yaml"
sed -E '/^  command:/d' "$WORK/py.yaml" >"$WORK/cpp.yaml"

cluster() {  # config -> samples_per_sec
  launch_samples_per_sec torch_worker_bench.sh "$1" "$ROOT/conf/hosts.local" "$WORK"
}
ddp_run() {
  /usr/bin/python3 "$ROOT/bench/ddp_baseline.py" --epochs "$EPOCHS" 2>/dev/null |
    sed -nE 's/.*"samples_per_sec": ([0-9.]+).*/\1/p'
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $EPOCHS epochs"
PY=() CPP=() DDP=() R_DDP=() R_CPP=()
for ((i = 1; i <= PAIRS; i++)); do
  py="$(cluster "$WORK/py.yaml")"
  cpp="$(cluster "$WORK/cpp.yaml")"
  ddp="$(ddp_run)"
  [[ -n "$ddp" ]] || { echo "torch_worker_bench.sh: the DDP run printed no figure" >&2; exit 1; }
  r_ddp="$(awk -v a="$py" -v b="$ddp" 'BEGIN {printf "%.3f", a / b}')"
  r_cpp="$(awk -v a="$py" -v b="$cpp" 'BEGIN {printf "%.3f", a / b}')"
  printf '  round %d: python %8.0f | c++ %8.0f | ddp %8.0f samples/s | python/ddp %s python/c++ %s\n' \
    "$i" "$py" "$cpp" "$ddp" "$r_ddp" "$r_cpp"
  PY+=("$py") CPP+=("$cpp") DDP+=("$ddp") R_DDP+=("$r_ddp") R_CPP+=("$r_cpp")
done
printf '  median: python %.0f, c++ %.0f, ddp %.0f samples/s; python/ddp %s, python/c++ %s\n' \
  "$(echo "${PY[*]}" | median)" "$(echo "${CPP[*]}" | median)" "$(echo "${DDP[*]}" | median)" \
  "$(echo "${R_DDP[*]}" | median)" "$(echo "${R_CPP[*]}" | median)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

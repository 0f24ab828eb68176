#!/usr/bin/env bash
# Training throughput of a local Strata cluster against its baselines,
# alternated in one session (docs/performance.md, issue 3's training figures):
#
#   A. batch 512 per worker: `scripts/launch.sh run` (2 pservers, 2 workers,
#      bsp, conf/local.yaml otherwise) against one `strata-worker --local`
#      process with 2 OpenBLAS threads at the same global batch (1024) and
#      no pservers: the cost of distribution.
#   B. batch 64 per worker: the same cluster against PyTorch DDP (gloo,
#      2 processes of 1 thread, batch 64 each; bench/ddp_baseline.py), when
#      Debian's python3-torch is installed.
#
#   bench/train_bench.sh [--pairs N] [--epochs E] [--ddp-epochs E] [--no-ddp]
#
# Built binaries are taken from build/bin. Prints one line per run and the
# medians; the machine's load average is printed first (an idle 2-core VM
# is noisy: say what else was running).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/bench/lib.sh"
BIN="$ROOT/build/bin"
PAIRS=3
EPOCHS=5
DDP_EPOCHS=2
DDP=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --pairs) PAIRS="$2"; shift 2 ;;
    --epochs) EPOCHS="$2"; shift 2 ;;
    --ddp-epochs) DDP_EPOCHS="$2"; shift 2 ;;
    --no-ddp) DDP=0; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "train_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for b in strata-master strata-pserver strata-worker; do
  [[ -x "$BIN/$b" ]] || { echo "train_bench.sh: $BIN/$b not built (scripts/build.sh)" >&2; exit 1; }
done
if [[ $DDP == 1 ]] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "train_bench.sh: no python3-torch in /usr/bin/python3; skipping the DDP pairs" >&2
  DDP=0
fi

WORK="$(mktemp -d /tmp/strata-train-bench.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

# conf/local.yaml with another batch and epoch count.
make_config() {  # batch epochs out
  sed -E -e "s/^(  batch_size:) *[0-9]+/\1 $1/" -e "s/^(  epochs:) *[0-9]+/\1 $2/" \
    -e "s/^(  progress_every_steps:) *[0-9]+/\1 1000000/" "$ROOT/conf/local.yaml" >"$3"
  grep -q "batch_size: $1" "$3" || { echo "train_bench.sh: cannot set batch_size in $3" >&2; exit 1; }
}
make_config 512 "$EPOCHS" "$WORK/b512.yaml"
make_config 1024 "$EPOCHS" "$WORK/b1024.yaml"
make_config 64 "$DDP_EPOCHS" "$WORK/b64.yaml"

json_field() {  # file key
  sed -nE "s/^ *\"$2\": ([0-9.eE+-]+),?$/\1/p" "$1" | head -1
}

cluster() {  # config -> "samples_per_sec comm_share"
  local dir="$WORK/run-$RANDOM"
  "$ROOT/scripts/launch.sh" run --config "$1" --hosts "$ROOT/conf/hosts.local" \
    --run-dir "$dir" --quiet >"$WORK/launch.log" 2>&1 ||
    { cat "$WORK/launch.log" >&2; echo "train_bench.sh: cluster run failed" >&2; exit 1; }
  echo "$(json_field "$dir/summary.json" samples_per_sec) $(json_field "$dir/summary.json" comm_share)"
}

local_run() {  # config threads -> samples_per_sec
  "$BIN/strata-worker" --config "$1" --local --cpu_threads "$2" --http_port -1 \
    >"$WORK/local.log" 2>&1 ||
    { cat "$WORK/local.log" >&2; echo "train_bench.sh: local run failed" >&2; exit 1; }
  sed -nE 's/.*local: [0-9]+ samples in [0-9.]+ s: ([0-9.]+) samples\/s.*/\1/p' "$WORK/local.log"
}

ddp_run() {
  /usr/bin/python3 "$ROOT/bench/ddp_baseline.py" --epochs "$DDP_EPOCHS" 2>/dev/null |
    sed -nE 's/.*"samples_per_sec": ([0-9.]+).*/\1/p'
}


echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
echo "A: batch 512/worker cluster vs --local at batch 1024, 2 threads ($EPOCHS epochs)"
A_RATIO=() A_COMM=() A_CL=() A_LOC=()
for ((i = 1; i <= PAIRS; i++)); do
  read -r sps comm < <(cluster "$WORK/b512.yaml")
  loc="$(local_run "$WORK/b1024.yaml" 2)"
  ratio="$(awk -v a="$sps" -v b="$loc" 'BEGIN {printf "%.3f", a / b}')"
  printf '  pair %d: cluster %8.0f samples/s comm_share %s | local %8.0f samples/s | ratio %s\n' \
    "$i" "$sps" "$comm" "$loc" "$ratio"
  A_RATIO+=("$ratio") A_COMM+=("$comm") A_CL+=("$sps") A_LOC+=("$loc")
done
printf '  median: cluster %.0f samples/s, comm_share %s, local %.0f samples/s, ratio %s\n' \
  "$(echo "${A_CL[*]}" | median)" "$(echo "${A_COMM[*]}" | median)" \
  "$(echo "${A_LOC[*]}" | median)" "$(echo "${A_RATIO[*]}" | median)"

if [[ $DDP == 1 ]]; then
  echo "B: batch 64/worker cluster vs PyTorch DDP (gloo, 2x1 thread, batch 64; $DDP_EPOCHS epochs)"
  B_RATIO=() B_CL=() B_DDP=()
  for ((i = 1; i <= PAIRS; i++)); do
    d="$(ddp_run)"
    [[ -n "$d" ]] || { echo "train_bench.sh: the DDP run printed no figure" >&2; exit 1; }
    read -r sps comm < <(cluster "$WORK/b64.yaml")
    ratio="$(awk -v a="$sps" -v b="$d" 'BEGIN {printf "%.3f", a / b}')"
    printf '  pair %d: DDP %8.0f samples/s | cluster %8.0f samples/s comm_share %s | ratio %s\n' \
      "$i" "$d" "$sps" "$comm" "$ratio"
    B_RATIO+=("$ratio") B_CL+=("$sps") B_DDP+=("$d")
  done
  printf '  median: DDP %.0f samples/s, cluster %.0f samples/s, ratio %s\n' \
    "$(echo "${B_DDP[*]}" | median)" "$(echo "${B_CL[*]}" | median)" \
    "$(echo "${B_RATIO[*]}" | median)"
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

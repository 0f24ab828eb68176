#!/usr/bin/env bash
# What checkpoints cost a training job (docs/performance.md, issue 6):
# conf/local.yaml (2 pservers, 2 workers, bsp) run without checkpoints and
# with checkpoints every 30 s and every 5 s, alternated in one session;
# training throughput of each against the run without, and the longest
# stall a partition's copy caused. Then the CTR job of conf/ctr.yaml: bytes
# written per (incremental) checkpoint against a full uncompressed dump.
#
#   bench/checkpoint_bench.sh [--rounds N] [--epochs E] [--no-ctr]
#
# Built binaries are taken from build/bin. Prints one line per run and the
# medians; the machine's load average first (a 2-core VM is noisy).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/build/bin"
ROUNDS=3
EPOCHS=25
CTR=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --epochs) EPOCHS="$2"; shift 2 ;;
    --no-ctr) CTR=0; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "checkpoint_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for b in strata strata-master strata-pserver strata-worker; do
  [[ -x "$BIN/$b" ]] || { echo "checkpoint_bench.sh: $BIN/$b not built" >&2; exit 1; }
done
work="$(mktemp -d /tmp/strata-ckpt-bench-XXXXXX)"
trap 'pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"

# config NAME EVERY_SECONDS (0 = no checkpoint section)
config() {
  # conf/local.yaml without its own checkpoint section.
  sed -e "s/epochs: 15/epochs: $EPOCHS/" -e "s/progress_every_steps: 100/progress_every_steps: 1000/" \
    "$ROOT/conf/local.yaml" | awk '/^checkpoint:/ {skip = 1; next} /^[a-z]/ {skip = 0} !skip' \
    > "$work/$1.yaml"
  if [[ "$2" != 0 ]]; then
    printf 'checkpoint:\n  dir: %s/ck-%s\n  every_seconds: %s\n  on_finish: false\n' \
      "$work" "$1" "$2" >> "$work/$1.yaml"
  fi
}
field() { sed -n "s/.*\"$2\": *\"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}\$/\1/p" "$1" | head -n 1; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

config none 0
config every30 30
config every5 5
declare -A rates
for r in $(seq 1 "$ROUNDS"); do
  for v in none every30 every5; do
    "$ROOT/scripts/launch.sh" run --config "$work/$v.yaml" --hosts "$ROOT/conf/hosts.local" \
      --run-dir "$work/run-$v-$r" --bin-dir "$BIN" --quiet > "$work/run-$v-$r.out" 2>&1 ||
      { tail -n 20 "$work/run-$v-$r.out"; exit 1; }
    s="$work/run-$v-$r/summary.json"
    rate="$(field "$s" samples_per_sec)"
    rates[$v]+="$rate "
    echo "round $r $v: $rate samples/s, checkpoints $(field "$s" checkpoints || true)," \
      "longest stall $(field "$s" checkpoint_max_stall_seconds || true) s," \
      "mean write $(field "$s" checkpoint_seconds_mean || true) s, $(field "$s" checkpoint_bytes || true) bytes each"
  done
done
base="$(tr ' ' '\n' <<< "${rates[none]}" | grep . | median)"
for v in every30 every5; do
  m="$(tr ' ' '\n' <<< "${rates[$v]}" | grep . | median)"
  awk -v m="$m" -v b="$base" -v v="$v" 'BEGIN {printf "%s: median %.0f samples/s, %.3f of the run without checkpoints (%.0f)\n", v, m, m / b, b}'
done

if [[ $CTR == 1 ]]; then
  sed -e "s|dir: /tmp/strata-ctr/checkpoints|dir: $work/ck-ctr|" "$ROOT/conf/ctr.yaml" > "$work/ctr.yaml"
  "$ROOT/scripts/launch.sh" run --config "$work/ctr.yaml" --hosts "$ROOT/conf/hosts.local" \
    --run-dir "$work/run-ctr" --bin-dir "$BIN" --quiet > "$work/run-ctr.out" 2>&1 ||
    { tail -n 20 "$work/run-ctr.out"; exit 1; }
  s="$work/run-ctr/summary.json"
  echo "ctr: $(field "$s" checkpoints) checkpoints, $(field "$s" checkpoint_bytes) bytes written each on" \
    "average, a full uncompressed dump $(field "$s" checkpoint_raw_bytes) bytes: ratio" \
    "$(field "$s" checkpoint_bytes_ratio); longest stall $(field "$s" checkpoint_max_stall_seconds) s;" \
    "test AUC $(field "$s" final_test_auc) (planted $(field "$s" planted_test_auc))"
fi

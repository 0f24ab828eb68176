#!/usr/bin/env bash
# What moving a partition costs a training job (docs/performance.md,
# "Moving partitions"; issue 26): a bsp MLP on Fashion-MNIST whose first
# layer is cut into 4 MiB slices (784 x 4096: three slices of 4 MiB and a
# rest), 1 worker, its steps traced (strata-worker --trace), scaled
# between 1 and 2 pservers ROUNDS times while it trains, each scale moving
# slices live. Per move: its bytes, how long from start to cut-over, and
# the stall it caused to bsp steps: the longest step in the move's window
# (from its start to 0.5 s after its cut-over) less the median step of
# the same run outside any move (the baseline, measured alongside).
# With --replication R the partitions have R backups and the job scales
# between R+1 and R+2 pservers: a cut-over then also waits for the new
# owner's backups to take its copy.
#
#   bench/migration_bench.sh [--rounds N] [--replication R]
#
# Built binaries are taken from build/bin.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="$ROOT/build"
ROUNDS=3
REPLICATION=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --replication) REPLICATION="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "migration_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
source "$ROOT/tests/e2e/lib.sh"
for b in strata strata-master strata-pserver strata-worker; do
  [[ -x "$BUILD_DIR/bin/$b" ]] || { echo "migration_bench.sh: $BUILD_DIR/bin/$b not built" >&2; exit 1; }
done
work="$(mktemp -d /tmp/strata-migration-bench-XXXXXX)"
trap '"$ROOT/scripts/launch.sh" down --run-dir "$work/run" >/dev/null 2>&1 || true; pkill -KILL -f -- "$work" 2>/dev/null || true; [[ -n ${KEEP_WORK:-} ]] || rm -rf "$work"' EXIT
base="$(pick_port_base)"
write_config "$work/job.yaml" bsp 50 "$base" 0
sed -i 's/^  layers: \[784, 128, 10\]$/  layers: [784, 4096, 10]/; s/^  slice_bytes: 131072$/  slice_bytes: 4194304/' "$work/job.yaml"
small=$((REPLICATION + 1)) big=$((REPLICATION + 2))
sed -i "s/^  dead_timeout_ms: 2000\$/  dead_timeout_ms: 2000\n  replication: $REPLICATION/" "$work/job.yaml"
printf 'elastic:\n  max_pservers: %d\n  max_moves: 1\n' "$big" >> "$work/job.yaml"
printf '127.0.0.1 master pserver=%d..%d worker=1\n' "$small" "$big" > "$work/hosts"
master="127.0.0.1:$base"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
STRATA_WORKER_FLAGS="--trace=$work/trace.json --trace_max_steps=0" \
  "$ROOT/scripts/launch.sh" run --config "$work/job.yaml" --hosts "$work/hosts" \
  --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 3600 > "$work/run.out" 2>&1 &
launcher=$!
wait_steps "$master" 50
sleep 3
for r in $(seq 1 "$ROUNDS"); do
  "$STRATA" scale --master "$master" --pservers "$big" --timeout 120 > /dev/null
  sleep 3
  "$STRATA" scale --master "$master" --pservers "$small" --timeout 120 > /dev/null
  sleep 3
done
"$ROOT/scripts/launch.sh" down --run-dir "$work/run" > /dev/null 2>&1 || true
wait "$launcher" 2>/dev/null || true
python3 - "$work/run/events.jsonl" "$work/trace.json" <<'PY'
import json, re, statistics, sys
events = [json.loads(l) for l in open(sys.argv[1])]
text = open(sys.argv[2]).read().rstrip().rstrip(",")
if not text.endswith("]"):
    text += "]"
trace = json.loads(text)
steps = [(e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3) for e in trace
         if e.get("name") == "step" and e.get("ph") == "X"]
moves = {}  # partition -> [start ms, bytes]
windows = []
for e in events:
    if e["kind"] == "moving":
        for part, mib in [(m[0], None) for m in re.findall(r"(\d+)(?: \(backup\))? node \d+ -> \d+", e["message"])]:
            moves[part] = e["unix_ms"]
    if e["kind"] == "moved":
        for part in re.findall(r"(\d+) node \d+ -> \d+", e["message"]):
            if part in moves:
                windows.append((part, moves.pop(part), e["unix_ms"]))
if not windows or len(steps) < 50:
    sys.exit("no moves or too few steps traced (%d moves, %d steps)" % (len(windows), len(steps)))
def in_any(s, e):
    return any(a - 100 <= e and s <= b + 500 for _, a, b in windows)
quiet = [e - s for s, e in steps if not in_any(s, e)]
median = statistics.median(quiet)
print("steps traced: %d; median step outside moves: %.1f ms (%d steps)" % (len(steps), median, len(quiet)))
stalls = []
for part, a, b in windows:
    inside = [(e - s, s) for s, e in steps if a - 100 <= e and s <= b + 500]
    worst, at = max(inside) if inside else (median, a)
    stalls.append(worst - median)
    # (Where the longest step began against the move's start: during the
    # copy, or at the cut-over.)
    print("partition %s: moved in %d ms (start to cut-over); longest step in its window %.1f ms, "
          "from +%d ms: stall %.1f ms" % (part, b - a, worst, at - a, worst - median))
print("moves: %d; stall per move: median %.1f ms, max %.1f ms (baseline step %.1f ms)"
      % (len(stalls), statistics.median(stalls), max(stalls), median))
# Throughput: bsp steps of a fixed batch, so steps/s in the moves' windows
# (start to cut-over) against steps/s outside any window.
def rate(pred):
    done = [(s, e) for s, e in steps if pred(s, e)]
    span = sum(e - s for s, e in done)
    return len(done) / span * 1e3 if span > 0 else 0.0
during = rate(lambda s, e: any(a <= s and e <= b for _, a, b in windows))
outside = rate(lambda s, e: not in_any(s, e))
if during > 0 and outside > 0:
    print("throughput during moves: %.0f steps/s against %.0f outside them: %.2f"
          % (during, outside, during / outside))
PY

#!/usr/bin/env bash
# `strata scale` of the workers of a running bsp job (docs/operations.md,
# "Scaling"), with real daemons under `launch.sh run`: the job starts with
# 1 worker of the host file's room for 3, grows to 3 (launch.sh's provider
# starts workers 1 and 2, which join at a step boundary and take their
# share of the fixed global batch), refuses a second scale while one is in
# progress and scales beyond the room, shrinks to 1 (the others drain and
# exit 0, not restarted), grows again (a drained index started anew) and
# finishes: every record trained, the update ledger's lost 0, and the
# test accuracy within 0.035 of the same job run at a fixed size first.
# (A worker that joins a bsp job midway, by a scale or a restart, costs
# about 1% of test accuracy here with 2000-record tasks, with a wider
# spread: 0.855-0.882 against 0.877-0.887 at a fixed size over seeds; the
# cause is the job's tail, where one worker trains the rest of its last
# task alone at its share of the batch (docs/reliability.md, "Accuracy
# after a worker restart"). The tasks here are of 500 records, as in the
# fault suite, which shortens that tail but does not end it: CI saw
# 0.8564 against 0.8819 (0.0255) with them. The bound is those spreads'
# extremes, 0.855 against 0.887, and a little: a job that trains wrongly
# after a scale (lost or doubled updates) ends far lower, and the ledger
# and the record count are checked exactly.)
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
work="$(mktemp -d /tmp/strata-e2e-scale-XXXXXX)"
trap '"$ROOT/scripts/launch.sh" down --run-dir "$work/run" >/dev/null 2>&1 || true; pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
base="$(pick_port_base)"
# (Epochs enough that the job still trains when the last scale comes.)
epochs=14
write_config "$work/job.yaml" bsp "$epochs" "$base" 0 500
# (The pservers stay 2: the autoscaler, turned on for a moment below to
# test the CLI, would otherwise scale them in at once, its window having
# run while it was off, moving partitions mid-job that this test is not
# about.)
printf 'elastic:\n  min_pservers: 2\n  max_pservers: 2\n' >> "$work/job.yaml"
printf '127.0.0.1 master pserver=2 worker=1\n' > "$work/fixed-hosts"
"$ROOT/scripts/launch.sh" run --config "$work/job.yaml" --hosts "$work/fixed-hosts" \
  --run-dir "$work/fixed" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 300 > "$work/fixed.out" 2>&1 ||
  { tail -n 20 "$work/fixed.out"; fail "the fixed-size job failed"; }
fixed_acc="$(json_field "$work/fixed/summary.json" final_test_accuracy)"
printf '127.0.0.1 master pserver=2 worker=1..3\n' > "$work/hosts"
master="127.0.0.1:$base"
"$ROOT/scripts/launch.sh" run --config "$work/job.yaml" --hosts "$work/hosts" \
  --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 300 > "$work/run.out" 2>&1 &
launcher=$!
wait_steps "$master" 100

status_json() { "$STRATA" status --master "$master" --json 2>/dev/null || true; }
# workers STATE: the indices of the workers in that state ("ALIVE", ...).
workers() {
  status_json | python3 -c "import json,sys
v=json.load(sys.stdin)['view']['members']
print(' '.join(sorted(str(m.get('index',0)) for m in v if m['role']=='WORKER' and m.get('state')=='$1')))"
}
# samples_steps: the job's samples and steps now.
samples_steps() {
  status_json | python3 -c "import json,sys
j=json.load(sys.stdin)['job']; print(int(j.get('samples',0)), int(j.get('steps',0)))"
}

# Grow to 3. The scale is done when both new workers train.
out="$("$STRATA" scale --master "$master" --workers 3 --reason e2e-grow)" ||
  fail "scale to 3 failed: $out"$'\n'"$(tail -n 20 "$work/run/logs/master-0.log")"
echo "$out"
grep -q '^workers 1 -> 3: starting workers 1, 2' <<< "$out" || fail "unexpected scale answer: $out"
grep -qE 'scale done \(workers 1 -> 3: starting workers 1, 2\) in [0-9.]+ s: the new workers train' <<< "$out" ||
  fail "scale to 3 not done: $out"
[[ "$(workers ALIVE)" == "0 1 2" ]] || fail "workers alive after growing: '$(workers ALIVE)'"
grep -q '"kind": "scale_done"' "$work/run/events.jsonl" || fail "no scale_done event"
# The global batch stays 64: once every worker is on a task leased after
# the scale, a bsp step trains 64 samples whatever the number of workers.
sleep 3
read -r s0 t0 <<< "$(samples_steps)"
sleep 2
read -r s1 t1 <<< "$(samples_steps)"
python3 - "$s0" "$t0" "$s1" "$t1" <<'PY' || fail "samples per step after growing is not the global batch"
import sys
s0, t0, s1, t1 = map(int, sys.argv[1:])
per = (s1 - s0) / max(1, t1 - t0)
print("samples per bsp step with 3 workers: %.1f" % per)
sys.exit(0 if 56 <= per <= 72 else 1)
PY

# The autoscaler on and off by hand (it is off in this job's config).
out="$("$STRATA" scale --master "$master" --autoscale on)" || fail "autoscale on: $out"
[[ "$(status_json | python3 -c 'import json,sys; print(json.load(sys.stdin)["job"]["autoscale"])')" == "autoscale on"* ]] ||
  fail "status after --autoscale on: $(status_json | head -c 600)"
out="$("$STRATA" scale --master "$master" --autoscale off)" || fail "autoscale off: $out"
grep -q '"kind": "autoscale", "message": "autoscale off (strata scale)"' "$work/run/events.jsonl" ||
  fail "no autoscale event: $(grep autoscale "$work/run/events.jsonl")"

# Refusals: beyond the host file's room; a second scale while one goes on.
if out="$("$STRATA" scale --master "$master" --workers +1 2>&1)"; then
  fail "scaling beyond the room was accepted: $out"
fi
grep -q "beyond the host file's room for 3" <<< "$out" || fail "unexpected refusal: $out"

# Shrink to 1: workers 2 and 1 drain, exit 0 and are not restarted.
out="$("$STRATA" scale --master "$master" --workers 1 --no-wait)" || fail "scale to 1 failed: $out"
if out2="$("$STRATA" scale --master "$master" --workers 2 2>&1)"; then
  # (The drain may have been quick: then the second scale is a new one.)
  grep -q "scale done" <<< "$out2" || fail "second scale: $out2"
  out="$("$STRATA" scale --master "$master" --workers 1)" || fail "scale back to 1 failed: $out"
else
  grep -q "a scale is in progress (workers 3 -> 1" <<< "$out2" || fail "unexpected refusal: $out2"
fi
for _ in $(seq 1 300); do
  [[ "$(workers ALIVE)" == "0" ]] && break
  sleep 0.1
done
[[ "$(workers ALIVE)" == "0" ]] || fail "workers alive after shrinking: '$(workers ALIVE)'"
sleep 1
grep -q "restarting worker" "$work/run.out" && fail "a drained worker was restarted: $(cat "$work/run.out")"

# Grow again: a drained index starts anew, under the launcher's care.
out="$("$STRATA" scale --master "$master" --workers 2)" || fail "scale to 2 failed: $out"
grep -q 'scale done' <<< "$out" || fail "scale to 2 not done: $out"

set +e; wait "$launcher"; rc=$?; set -e
(( rc == 0 )) || { tail -n 30 "$work/run.out"; fail "launch.sh run exited $rc"; }
summary="$work/run/summary.json"
check_scaled_job "$summary" "scaling 1 -> 3 -> 1 -> 2 workers" "$fixed_acc" 0.035 "$epochs"
# 1 -> 3, 3 -> 1 and the last 1 -> 2; with a quick drain, also the second
# scale's 1 -> 2 and its 2 -> 1 (500-record tasks drain quickly).
# (The workers' scales only.)
grep -c '"kind": "scale_done", "message": "scale done (workers' "$work/run/events.jsonl" | grep -qE '^[345]$' ||
  fail "expected 3 to 5 scale_done events of the workers: $(grep scale "$work/run/events.jsonl")"
echo "ok: scaled 1 -> 3 -> 1 -> 2 workers while training"

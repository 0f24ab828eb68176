#!/usr/bin/env bash
# The autoscaler's pservers (elastic.pserver_*; master/autoscaler.h) on a
# bsp job of real daemons under `launch.sh run` (its own provider): the
# pservers' heartbeats carry their apply queue, CPU and memory; the job
# starts with 1 pserver of room for 2 and thresholds a training pserver
# passes (CPU 3% of its cores, averaged over 2 s), so the autoscaler adds
# one and partitions move onto it; then the only worker is stopped
# (SIGSTOP: the pservers idle under elastic.pserver_cpu_low), so it
# removes one (its partitions moved away first, its backups dropped with
# it: no other pserver is left to hold them; it exits 0); the worker
# goes on (`strata scale --autoscale off` first) and the job finishes
# with the ledger's lost 0. Each decision is an event with its measured
# reason.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
work="$(mktemp -d /tmp/strata-e2e-psauto-XXXXXX)"
worker_pid=""
trap '[[ -z $worker_pid ]] || kill -CONT "$worker_pid" 2>/dev/null || true; "$ROOT/scripts/launch.sh" down --run-dir "$work/run" >/dev/null 2>&1 || true; pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
base="$(pick_port_base)"
write_config "$work/job.yaml" bsp 6 "$base" 0
# (A stopped worker is not declared dead while the pservers idle.)
sed -i -e 's/^cluster:$/cluster:\n  replication: 1/' -e 's/dead_timeout_ms: 2000/dead_timeout_ms: 60000/' \
  "$work/job.yaml"
cat >> "$work/job.yaml" <<YAML
elastic:
  autoscale: true
  cooldown_seconds: 0
  max_workers: 1
  max_pservers: 2
  pserver_signal_seconds: 2
  pserver_cpu_high: 0.03
  pserver_cpu_low: 0.015
  pserver_queue_low: 0.5
  move_rate_mb_per_s: 8
YAML
printf '127.0.0.1 master pserver=1..2 worker=1\n' > "$work/hosts"
master="127.0.0.1:$base"
"$ROOT/scripts/launch.sh" run --config "$work/job.yaml" --hosts "$work/hosts" \
  --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 300 > "$work/run.out" 2>&1 &
launcher=$!
wait_steps "$master" 20

events() {
  sed -n 's/.*"kind": "\(scale[a-z_]*\|autoscale\|moved\)", "message": "\([^"]*\)".*/\1: \2/p' \
    "$work/run/events.jsonl"
}
# wait_event PATTERN: until an event matches (60 s at most).
wait_event() {
  for _ in $(seq 1 600); do
    events | grep -qE "$1" && return 0
    sleep 0.1
  done
  fail "no event matching '$1'"$'\n'"$(events)"$'\n'"$(tail -n 20 "$work/run/logs/master-0.log")"
}
wait_event '^scale: scale \(autoscale: pserver node [0-9]+ averaged CPU [0-9]+% of its cores \(elastic.pserver_cpu_high 3%\) over 2 s: adding a pserver \(1 -> 2\)\)'
wait_event '^scale_done: scale done \(pservers 1 -> 2'
grep -q '^moved: ' <<< "$(events)" || fail "no partition moved to the pserver added"$'\n'"$(events)"
"$STRATA" status --master "$master" | grep -E 'autoscale on; pservers \(the highest\): apply queue [0-9.]+, CPU [0-9]+%, memory [0-9]+%' ||
  fail "strata status shows no pserver load: $("$STRATA" status --master "$master")"

# The worker stopped: the pservers idle, one is removed.
for _ in $(seq 1 50); do
  [[ -s "$work/run/pids/worker-0" ]] && break
  sleep 0.1
done
read -r _h worker_pid < "$work/run/pids/worker-0"
kill -STOP "$worker_pid"
wait_event '^scale: scale \(autoscale: every pserver under elastic.pserver_\*_low over 2 s \(the highest: apply queue [0-9.]+, CPU [0-9]+%, memory [0-9]+%\): removing a pserver \(2 -> 1\)'
wait_event '^scale_done: scale done \(pservers 2 -> 1'
for _ in $(seq 1 100); do
  [[ -f "$work/run/exit/pserver-1" ]] && break
  sleep 0.1
done
[[ "$(cat "$work/run/exit/pserver-1" 2>/dev/null)" == 0 ]] ||
  fail "the pserver removed did not exit 0 (exit: $(cat "$work/run/exit/pserver-1" 2>/dev/null))"
# Off: the worker going on brings the load back, and nothing follows.
out="$("$STRATA" scale --master "$master" --autoscale off)" || fail "autoscale off: $out"
wait_event '^autoscale: autoscale off'
kill -CONT "$worker_pid"
worker_pid=""

set +e; wait "$launcher"; rc=$?; set -e
(( rc == 0 )) || { tail -n 30 "$work/run.out"; fail "launch.sh run exited $rc"; }
summary="$work/run/summary.json"
[[ "$(json_field "$summary" state)" == succeeded ]] || fail "job did not succeed: $(cat "$summary")"
python3 - "$summary" <<'PY' || fail "summary after autoscaling: $(cat "$summary")"
import json, sys
s = json.load(open(sys.argv[1]))
ledger = s.get("ledger", {})
assert int(ledger.get("lost", 0)) == 0, ledger
assert int(ledger.get("held", 0)) == int(ledger.get("acked", 0)) > 0, ledger
assert int(s.get("records_done", 0)) == 6 * 60000, s.get("records_done")
print("test accuracy %.4f" % s["final_test_accuracy"])
PY
events | grep -E '^(scale|autoscale)' | head -n 20
echo "ok: the autoscaler added a pserver under load and removed one when idle"

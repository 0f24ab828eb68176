#!/usr/bin/env bash
# strata drain on a running cluster (bsp, 3 pservers with replication 1,
# 2 workers, supervised by launch.sh run): a pserver hands its partitions
# to their backups and exits 0 (not restarted); a worker finishes its data
# task and leaves; the job still succeeds with every data task trained once
# (none requeued) and no acknowledged update lost (the update ledger). The
# refusals (the master, the last worker, an unknown node) name the reason.
BUILD_DIR="$1"
source "$(dirname "$0")/../faults/lib.sh"
fault_config 1 8
start_job drain
wait_for_samples drain 20000
master="127.0.0.1:$BASE"

# A pserver: drained at once once its backups caught up (they take over);
# before that it is leaving, its partitions move, and it drains then.
"$STRATA" drain pserver-1 --master "$master" --timeout 120 --json > "$WORK/ps.json" 2> "$WORK/ps.err" ||
  { cat "$WORK/ps.err"; fail "drain pserver-1 failed"; }
python3 - "$WORK/ps.json" <<'PY' || { cat "$WORK/ps.json"; fail "drain pserver-1 --json is wrong"; }
import json, sys
d = json.load(open(sys.argv[1]))
assert d['node'] == 'pserver-1' and d['state'] == 'drained', d
assert ('taken over by their backups' in d['message'] or
        'its partitions move to the other pservers' in d['message']), d
PY
[[ "$(node_state PSERVER 1)" == DRAINED ]] || fail "pserver-1 is $(node_state PSERVER 1), not DRAINED"
for _ in $(seq 1 100); do
  [[ -f "$WORK/run-drain/exit/pserver-1" ]] && break
  sleep 0.1
done
[[ "$(cat "$WORK/run-drain/exit/pserver-1" 2>/dev/null)" == 0 ]] ||
  fail "the drained pserver did not exit 0 (exit: $(cat "$WORK/run-drain/exit/pserver-1" 2>/dev/null))"
grep -q 'drained by the master' "$WORK/run-drain/logs/pserver-1.log" || fail "pserver-1 does not log its drain"

# A worker: it finishes its data task, then leaves.
"$STRATA" drain worker-1 --master "$master" --timeout 60 > "$WORK/w.out" 2> "$WORK/w.err" ||
  { cat "$WORK/w.out" "$WORK/w.err"; fail "drain worker-1 failed"; }
grep -q 'worker 1 (node [0-9]*) is draining' "$WORK/w.out" || { cat "$WORK/w.out"; fail "drain worker-1 said no draining"; }
grep -qE '^worker-1 \(node [0-9]+\) has left the job \([0-9.]+ s\)$' "$WORK/w.out" ||
  { cat "$WORK/w.out"; fail "drain worker-1 did not wait until it had left"; }
[[ "$(node_state WORKER 1)" == DRAINED ]] || fail "worker-1 is $(node_state WORKER 1), not DRAINED"
grep -q 'drained by the master; its last data task is done' "$WORK/run-drain/logs/worker-1.log" ||
  fail "worker-1 does not log its drain"

# Refusals: the last worker, the master, an unknown node, a drained one again.
set +e
"$STRATA" drain worker-0 --master "$master" > /dev/null 2> "$WORK/err"; rc=$?
set -e
[[ $rc -eq 1 ]] && grep -q 'is the last worker' "$WORK/err" || { cat "$WORK/err"; fail "the last worker was not refused"; }
set +e
"$STRATA" drain master --master "$master" > /dev/null 2> "$WORK/err"; rc=$?
set -e
[[ $rc -eq 1 ]] && grep -q 'master cannot be drained' "$WORK/err" || { cat "$WORK/err"; fail "the master was not refused"; }
set +e
"$STRATA" drain worker-9 --master "$master" > /dev/null 2> "$WORK/err"; rc=$?
set -e
[[ $rc -eq 1 ]] && grep -q 'no node worker-9' "$WORK/err" || { cat "$WORK/err"; fail "an unknown node was not named"; }
"$STRATA" drain worker-1 --master "$master" --no-wait | grep -q 'already drained' ||
  fail "draining a drained worker again does not say so"
"$STRATA" status --master "$master" | grep -qE 'worker +1 +127\.0\.0\.1 +drained' ||
  { "$STRATA" status --master "$master"; fail "strata status does not show worker-1 drained"; }

wait_job || fail "the job failed after the drains: $(why drain)"
s="$(summary drain)"
[[ "$(json_field "$s" state)" == succeeded ]] || fail "the job did not succeed: $(why drain)"
[[ "$(summary_field drain tasks_requeued)" == 0 ]] || fail "data tasks were requeued: $(cat "$s")"
[[ "$(ledger_field drain lost)" == 0 ]] || fail "acknowledged updates lost: $(cat "$s")"
(( $(ledger_field drain acked) > 0 )) || fail "the ledger saw no acknowledged push"
grep -q 'pserver-1 failed' "$WORK/drain.out" && fail "launch.sh restarted the drained pserver: $(cat "$WORK/drain.out")"
acc="$(accuracy drain)"
python3 -c "import sys; sys.exit(0 if $acc > 0.8 else 1)" || fail "final accuracy $acc after the drains"
grep -q 'pserver 1 (node [0-9]*) drained (strata drain)' "$s" || fail "no drain event for pserver 1 in the summary"
# The audit log has each drain with its caller and result, and the drains.
"$STRATA" audit verify --file "$WORK/run-drain/audit.jsonl" > /dev/null || fail "the audit log does not verify"
python3 - "$WORK/run-drain/audit.jsonl" <<'PY' || fail "the audit log lacks the drains"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
drains = [r for r in recs if r['action'] == 'drain']
ok = [r for r in drains if r['result'] == 'ok']
refused = [r for r in drains if r['result'].startswith('failed: FAILED_PRECONDITION')]
assert len(ok) == 3 and all(r['from'].startswith('ipv4:127.0.0.1:') for r in ok), drains
assert any('the last worker' in r['result'] for r in refused), refused
assert any('master cannot be drained' in r['result'] for r in refused), refused
kinds = [r['action'] for r in recs]
assert kinds.count('node_drained') == 2 and kinds.count('node_draining') == 1, kinds
PY
echo "PASS: drained pserver-1 and worker-1; job succeeded, accuracy $acc, ledger $(ledger_field drain acked) acked, 0 lost"
assert_nothing_left "$WORK"

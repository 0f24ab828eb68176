#!/usr/bin/env bash
# The operator CLI against a running local cluster (1 master, 2 pservers,
# 2 workers): `strata top` (per node steps/s, samples/s, push and pull GB/s,
# comm share, memory; --json frames and the table) and `strata logs NODE`
# (a node's recent log lines from its /logs) and `strata stop`, with their
# errors.
BUILD_DIR="$1"
source "$(dirname "$0")/../e2e/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"

work="$(mktemp -d /tmp/strata-cli-XXXXXX)"
trap '"$ROOT/scripts/launch.sh" down --run-dir "$work/run" > /dev/null 2>&1 || true; pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
base="$(pick_port_base)"
write_config "$work/job.yaml" bsp 50 "$base"
printf '127.0.0.1 master pserver=2 worker=2\n' > "$work/hosts"
"$ROOT/scripts/launch.sh" up --config "$work/job.yaml" --hosts "$work/hosts" \
  --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" > "$work/up.out" 2>&1 ||
  { cat "$work/up.out"; fail "launch.sh up failed"; }
master="127.0.0.1:$base"
wait_steps "$master" 50

# top --json: a baseline scrape, then one frame a second.
"$STRATA" top --master "$master" --iterations 2 --interval 1 --json > "$work/top.json" ||
  fail "strata top --json failed"
python3 - "$work/top.json" <<'PY' || { cat "$work/top.json"; fail "strata top --json frames are wrong"; }
import json, sys
frames = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert len(frames) == 2, f'{len(frames)} frames'
for f in frames:
    assert f['state'] == 'running' and f['step'] > 0, f
    nodes = {n['name']: n for n in f['nodes']}
    assert set(nodes) == {'master-0', 'pserver-0', 'pserver-1', 'worker-0', 'worker-1'}, nodes
    for n in nodes.values():
        assert n['up'] and n['memory_bytes'] > 1e6, n
    for w in ('worker-0', 'worker-1'):
        n = nodes[w]
        assert n['steps_per_sec'] > 0 and n['samples_per_sec'] > 0, n
        assert n['push_gb_per_sec'] > 0 and n['pull_gb_per_sec'] > 0, n
        assert 0 <= n['comm_share'] <= 1, n
    for p in ('pserver-0', 'pserver-1'):
        assert nodes[p]['push_gb_per_sec'] > 0 and nodes[p]['pull_gb_per_sec'] > 0, nodes[p]
print('top --json: 2 frames of 5 nodes')
PY
# top as a table (not a terminal: frames one after another).
"$STRATA" top --master "$master" --iterations 1 --interval 0.5 > "$work/top.txt" ||
  fail "strata top failed"
cat "$work/top.txt"
grep -qE '^NODE +HOST +STATE +STEPS/S +SAMPLES/S +PUSH GB/s +PULL GB/s +COMM +MEMORY' "$work/top.txt" ||
  fail "strata top prints no table header"
grep -qE '^worker-1 +127\.0\.0\.1 +alive +[0-9.]+ +[0-9]+ ' "$work/top.txt" ||
  fail "strata top has no figures for worker-1"

# logs NODE.
"$STRATA" logs worker-1 --master "$master" --lines 20 > "$work/w1.log" || fail "strata logs worker-1 failed"
n="$(wc -l < "$work/w1.log")"
(( n > 0 && n <= 20 )) || fail "strata logs --lines 20 printed $n lines"
grep -q 'worker 1' "$work/w1.log" || { cat "$work/w1.log"; fail "worker-1's log lines are not its own"; }
"$STRATA" logs master --master "$master" > "$work/m.log" || fail "strata logs master failed"
grep -q 'registered as node' "$work/m.log" || fail "the master's log lacks the registrations"
set +e
"$STRATA" logs worker-7 --master "$master" > /dev/null 2> "$work/err"; rc=$?
set -e
[[ $rc -eq 1 ]] && grep -q 'no node worker-7' "$work/err" || { cat "$work/err"; fail "an unknown node is not named"; }
set +e
"$STRATA" top > /dev/null 2> "$work/err"; rc=$?
set -e
[[ $rc -eq 2 ]] && grep -q -- '--master' "$work/err" || fail "top without --master does not say what is missing"

# stop: the job ends "stopped" (no checkpoint section: none taken); again: an error.
"$STRATA" stop --master "$master" > "$work/stop.out" || { cat "$work/stop.out"; fail "strata stop failed"; }
grep -q 'job stopped (no checkpoint)' "$work/stop.out" || { cat "$work/stop.out"; fail "strata stop said $(cat "$work/stop.out")"; }
"$STRATA" status --master "$master" --json > "$work/status.json"
[[ "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["job"]["state"])' "$work/status.json")" == stopped ]] ||
  fail "the job is not stopped after strata stop"
set +e
"$STRATA" stop --master "$master" > /dev/null 2> "$work/err"; rc=$?
set -e
[[ $rc -eq 1 ]] && grep -q 'already ended' "$work/err" || { cat "$work/err"; fail "a second stop is not refused"; }

# The audit log: the joins, the stop and the refused stop with their
# callers; its chain intact, its head the master's; an edit found.
audit="$work/run/audit.jsonl"
"$STRATA" audit verify --file "$audit" > "$work/audit.out" || { cat "$work/audit.out"; fail "the audit log does not verify"; }
cat "$work/audit.out"
"$STRATA" status --master "$master" --json > "$work/status.json"
python3 - "$audit" "$work/status.json" <<'PY' || fail "the audit log lacks what it must record"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
status = json.load(open(sys.argv[2]))['job']
# (The file is read after the status: records may have been added since.)
n = int(status['auditRecords'])
assert 0 < n <= len(recs) and status['auditHead'] == recs[n - 1]['hash'], (n, len(recs))
acts = [(r['action'], r['who'], r['result']) for r in recs]
assert sum(a == 'node_join' for a, _, _ in acts) == 4, acts
stops = [r for r in recs if r['action'] == 'stop']
assert len(stops) == 2, stops
assert stops[0]['who'] == 'plaintext' and stops[0]['from'].startswith('ipv4:127.0.0.1:') \
    and stops[0]['result'] == 'ok', stops[0]
assert stops[1]['result'].startswith('failed: FAILED_PRECONDITION'), stops[1]
assert any(a == 'job_state' and 'stopped' in r['detail'] for r, (a, _, _) in zip(recs, acts)), acts
for r in recs:
    assert set(r) == {'seq', 'unix_ms', 'time', 'who', 'from', 'action', 'target', 'result', 'detail', 'prev', 'hash'}, r
print(f'audit: {len(recs)} records; stop by {stops[0]["who"]}')
PY
sed '3s/"result": "ok"/"result": "OK"/' "$audit" > "$work/audit-edited.jsonl"
set +e
"$STRATA" audit verify --file "$work/audit-edited.jsonl" > /dev/null 2> "$work/err"; rc=$?
set -e
[[ $rc -eq 1 ]] && grep -q "audit-edited.jsonl:3: the hash does not match" "$work/err" ||
  { cat "$work/err"; fail "an edited audit record was not found"; }

"$ROOT/scripts/launch.sh" down --run-dir "$work/run" > /dev/null
assert_nothing_left "$work"
echo "PASS: strata top, logs and stop"

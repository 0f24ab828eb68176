#!/usr/bin/env bash
# Why is a step slow: a job run with launch.sh --trace (1 master, 2 pservers,
# 2 workers, checkpoints on):
#   - each worker's trace is Chrome trace-event JSON (what chrome://tracing
#     and Perfetto open): step spans, and within them forward and backward
#     compute per table and the waits; push and pull requests on lanes of
#     their own; spans nested in their steps;
#   - summary.json has the mean time of each phase (compute + wait = step);
#   - the master's event log (run/events.jsonl) has a JSON line for every
#     node that joined, the job's states and the checkpoints.
BUILD_DIR="$1"
source "$(dirname "$0")/../e2e/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"

work="$(mktemp -d /tmp/strata-trace-XXXXXX)"
trap 'pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
base="$(pick_port_base)"
write_config "$work/job.yaml" bsp 1 "$base" 12000
cat >> "$work/job.yaml" <<YAML
checkpoint:
  dir: $work/ckpt
  every_steps: 40
  every_seconds: 0
YAML
printf '127.0.0.1 master pserver=2 worker=2\n' > "$work/hosts"
"$ROOT/scripts/launch.sh" run --config "$work/job.yaml" --hosts "$work/hosts" --trace --quiet \
  --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" --timeout 150 > "$work/out" 2>&1 ||
  { cat "$work/out"; log_tails "$work/run"; fail "launch.sh run --trace failed"; }

python3 - "$work/run" > "$work/check.out" 2>&1 <<'PY' ||
import json, sys
run = sys.argv[1]
errors = []
def need(ok, what):
    if not ok: errors.append(what)
for w in (0, 1):
    path = f'{run}/trace/worker-{w}.json'
    events = json.load(open(path))
    spans = [e for e in events if e.get('ph') == 'X']
    names = {e['name'] for e in spans}
    need({'step', 'forward', 'backward', 'wait for pull', 'push', 'pull'} <= names,
         f'{path}: span names {sorted(names)}')
    steps = [e for e in spans if e['name'] == 'step']
    need(len(steps) >= 50, f'{path}: {len(steps)} steps')
    need(all('step' in e['args'] and e['args']['samples'] > 0 for e in steps), f'{path}: step args')
    lanes = {e['name']: e['tid'] for e in spans}
    need(lanes.get('push') == 2 and lanes.get('pull') == 3 and lanes.get('step') == 1,
         f'{path}: lanes {lanes}')
    need(any(e['name'] == 'thread_name' for e in events), f'{path}: lanes unnamed')
    need(all(e['dur'] >= 0 and e['ts'] > 1.6e15 for e in spans), f'{path}: timestamps')
    # Compute and waits of a step lie within it, and name their table.
    inner = [e for e in spans if e['tid'] == 1 and e['name'] != 'step']
    need(all('table' in e.get('args', {}) for e in inner if e['name'] == 'wait for pull'),
         f'{path}: a wait for a pull without its table')
    tables = {e['args']['table'] for e in inner if e['name'] == 'backward' and 'args' in e}
    need(len(tables) >= 2, f'{path}: backward spans of tables {tables}')
    starts = sorted((e['ts'], e['ts'] + e['dur']) for e in steps)
    import bisect
    outside = 0
    for e in inner:
        i = bisect.bisect_right(starts, (e['ts'], float('inf'))) - 1
        if i < 0 or not (starts[i][0] <= e['ts'] and e['ts'] + e['dur'] <= starts[i][1] + 1):
            outside += 1
    need(outside == 0, f'{path}: {outside} of {len(inner)} spans outside their step')
summary = json.load(open(f'{run}/summary.json'))
p = summary.get('step_phases', {})
need(p.get('step_seconds', 0) > 0 and p.get('compute_seconds', 0) > 0 and
     p.get('wait_seconds', -1) >= 0, f'step phases {p}')
need(abs(p.get('compute_seconds', 0) + p.get('wait_seconds', 0) - p.get('step_seconds', 0)) < 1e-5,
     f'compute + wait != step: {p}')
need(p.get('pushes_applied', 0) > 0 and 0 < p.get('apply_seconds_per_push', 0) < 1,
     f'apply phase {p}')
kinds = {}
for n, line in enumerate(open(f'{run}/events.jsonl'), 1):
    e = json.loads(line)
    need({'unix_ms', 'time', 'job', 'kind', 'message'} <= set(e), f'events.jsonl:{n}: fields {e}')
    kinds.setdefault(e['kind'], []).append(e)
joins = kinds.get('node_join', [])
need(len(joins) == 4 and {(e['role'], e['index']) for e in joins} ==
     {('pserver', 0), ('pserver', 1), ('worker', 0), ('worker', 1)}, f'joins {joins}')
states = [e['message'].split(':')[0] for e in kinds.get('job_state', [])]
need(states[:1] == ['job running'] and states[-1] == 'job succeeded', f'job states {states}')
need(len(kinds.get('checkpoint', [])) >= 1, 'no checkpoint event')
print(f'traces, step phases {p}, events {sorted(kinds)}')
for e in errors: print('ERROR', e)
sys.exit(1 if errors else 0)
PY
  { cat "$work/check.out"; fail "trace / event log check failed"; }
cat "$work/check.out"
assert_nothing_left "$work"
echo "PASS: traces, step phases and the event log"

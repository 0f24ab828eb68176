# Helpers for the fault-injection suite (docs/reliability.md): each test
# runs a real-binary cluster from scripts/launch.sh on 127.0.0.1, once
# without the fault (the baseline, same seed) and once with it, and checks
# what the fault must not change. Sourced; expects BUILD_DIR.
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"

WORK="$(mktemp -d /tmp/strata-fault-XXXXXX)"
RUN_PID=""
cleanup_fault() {  # [EXIT_STATUS]
  local rc="${1:-$?}"
  set +e
  [[ -n "$RUN_PID" ]] && kill "$RUN_PID" 2>/dev/null
  for d in "$WORK"/run-*; do
    [[ -d "$d/pids" ]] && "$ROOT/scripts/launch.sh" down --run-dir "$d" > /dev/null 2>&1
  done
  pkill -CONT -f -- "$WORK" 2>/dev/null
  pkill -KILL -f -- "$WORK" 2>/dev/null
  [[ -n "${KEEP_WORK:-}" ]] || rm -rf "$WORK"
  exit "$rc"
}
trap cleanup_fault EXIT

# Records per data task (FAULT_TASK_RECORDS overrides it, e.g. 2000 to run
# a fault against the e2e tests' task size).
TASK_RECORDS="${FAULT_TASK_RECORDS:-500}"
# fault_config REPLICATION EPOCHS [EXTRA_YAML]: a bsp MLP job on
# Fashion-MNIST, 3 pservers and 2 workers, fast failure detection.
fault_config() {
  local replication="$1" epochs="$2" extra="${3:-}"
  BASE="$(pick_port_base)"
  write_config "$WORK/job.yaml" bsp "$epochs" "$BASE"
  # Small data tasks (docs/reliability.md, "Accuracy after a worker
  # restart"): a requeued task retrains less, and when the workers' task
  # boundaries fall apart (a worker restarted), the last worker alone at
  # the end of the job trains at most one task's batches at half the batch.
  sed -i "s/^  task_records: 2000\$/  task_records: $TASK_RECORDS/" "$WORK/job.yaml"
  sed -i "s/^  dead_timeout_ms: 2000\$/  dead_timeout_ms: 2000\n  replication: $replication/" "$WORK/job.yaml"
  [[ -n "$extra" ]] && printf '%s\n' "$extra" >> "$WORK/job.yaml"
  printf '127.0.0.1 master pserver=3 worker=2\n' > "$WORK/hosts"
}

# use_sgd: plain SGD (lr 0.02) instead of the tests' Adam, for a fault that
# moves the workers' task boundaries (docs/reliability.md, "Accuracy after
# a worker restart"). (At lr 0.05 the final accuracy of a moved schedule
# jittered by up to 1.7 points in CI; at 0.02 by 0.07 to 0.3 here, loaded
# or not.)
use_sgd() {
  sed -i 's/^  type: adam$/  type: sgd/; s/^  learning_rate: 0.001$/  learning_rate: 0.02/' "$WORK/job.yaml"
  grep -q '^  type: sgd$' "$WORK/job.yaml" || fail "use_sgd: no optimizer section to change"
}

# run_job NAME [launch.sh flags]: runs the job to its end in the
# foreground; its exit status is launch.sh's, output in $WORK/NAME.out.
run_job() {
  local name="$1"; shift
  "$ROOT/scripts/launch.sh" run --config "$WORK/job.yaml" --hosts "$WORK/hosts" \
    --run-dir "$WORK/run-$name" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 300 "$@" \
    > "$WORK/$name.out" 2>&1
}
# start_job NAME [flags]: the same in the background (RUN_PID); wait_job
# collects its exit status.
start_job() {
  local name="$1"; shift
  run_job "$name" "$@" &
  RUN_PID=$!
  for _ in $(seq 1 300); do
    [[ -f "$WORK/run-$name/master.http" ]] && break
    sleep 0.1
  done
  # An mtls job's endpoints: read with the run's admin certificate.
  if [[ -f "$WORK/run-$name/tls.dir" ]]; then
    HTTP_TLS_DIR="$(cat "$WORK/run-$name/tls.dir")/admin"
  else
    HTTP_TLS_DIR=""
  fi
}
wait_job() {
  local rc=0
  wait "$RUN_PID" || rc=$?
  RUN_PID=""
  return $rc
}

master_status() { http_get "127.0.0.1:$((BASE + 1))/status"; }
# pserver_version INDEX: the highest partition version pserver INDEX holds.
pserver_version() {
  http_get "127.0.0.1:$((BASE + 30 + $1))/status" | python3 -c '
import json, sys
p = json.load(sys.stdin).get("partitions", [])
print(max([int(x.get("version", 0)) for x in p] + [0]))'
}
job_samples() { master_status | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["job"].get("samples", 0)))'; }
# node_state ROLE INDEX: the state of the newest node of that role and index.
node_state() {
  master_status | python3 -c "import json,sys
m=[x for x in json.load(sys.stdin)['view']['members'] if x['role']=='$1' and x.get('index',0)==$2]
print(m[0]['state'] if m else 'NONE')"
}
# pid_of NAME DAEMON: its pid now ("" while launch.sh rewrites the file).
pid_of() {
  local _h p="" f="$WORK/run-$1/pids/$2"
  if [[ -s "$f" ]]; then read -r _h p < "$f" || true; fi
  echo "$p"
}

# wait_for_samples NAME N: until the job has trained N samples (bounded).
# 180 s at most (a job's start on a loaded 2-core machine: the daemons,
# the data, the first steps), and no longer than the job lives; a failure
# names the samples reached and shows why().
wait_for_samples() {
  local n=0 deadline=$((SECONDS + 180))
  while (( SECONDS < deadline )); do
    n="$(job_samples 2>/dev/null || echo 0)"
    (( n >= $2 )) && return 0
    if [[ -n "$RUN_PID" ]] && ! kill -0 "$RUN_PID" 2>/dev/null; then
      fail "$1: the job ended at $n samples, before $2$(printf '\n'; why "$1")"
    fi
    sleep 0.1
  done
  fail "$1: the job did not reach $2 samples in 180 s (it has $n)$(printf '\n'; why "$1")"
}

# expect_training_goes_on NAME WHAT: the job trains 5000 more samples
# within 30 s (no hang on a step after a fault); else fails with "WHAT"
# and why().
expect_training_goes_on() {
  local a="" n deadline=$((SECONDS + 30))
  # (The master may not answer for a moment: a new leader's status page
  # comes up after its election.)
  while (( SECONDS < deadline )); do
    n="$(job_samples 2>/dev/null)" || n=""
    if [[ -z "$a" ]]; then
      a="$n"
    elif [[ -n "$n" ]] && (( n > a + 5000 )); then
      return 0
    fi
    sleep 0.05
  done
  fail "$2 (at $(job_samples 2>/dev/null) samples, ${a:-none} before)$(printf '\n'; why "$1")"
}

now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.2f}')"; }

summary() { echo "$WORK/run-$1/summary.json"; }
accuracy() { json_field "$(summary "$1")" final_test_accuracy; }
# assert_accuracy_close NAME BASELINE: within 1% (absolute) of the baseline
# (ACCURACY_TOLERANCE overrides the 0.01).
assert_accuracy_close() {
  local a b tol="${ACCURACY_TOLERANCE:-0.01}"; a="$(accuracy "$1")"; b="$(accuracy "$2")"
  python3 -c "import sys; sys.exit(0 if abs($a - $b) <= $tol else 1)" ||
    fail "$1: final accuracy $a is not within $tol of the fault-free run's $b
$(python3 -c "import json,sys
s = json.load(open(sys.argv[1]))
print('events:', *s.get('events', []), sep='\n  ')
print('workers:', *s.get('workers', []), sep='\n  ')" "$(summary "$1")" 2>/dev/null)"
  echo "$1: final accuracy $a (fault-free: $b)"
}
# ledger_field NAME KEY: a field of the summary's update ledger.
ledger_field() {
  python3 -c "import json,sys; print(json.load(open('$(summary "$1")'))['ledger']['$2'])"
}
summary_field() {
  python3 -c "import json,sys; print(json.load(open('$(summary "$1")'))['$2'])"
}

# baseline_then_start NAME SAMPLES [flags]: the fault-free run (same seed),
# then run NAME in the background until it has trained SAMPLES samples.
baseline_then_start() {
  local name="$1" samples="$2"; shift 2
  run_job base || fail "the fault-free run failed: $(tail -5 "$WORK/base.out")"
  start_job "$name" "$@"
  wait_for_samples "$name" "$samples"
}

# throughput NAME T_FROM: a line with the job's samples/s in the 3 s from
# T_FROM (recovery, new backups catching up; docs/reliability.md,
# "Measured") against the fault-free run's over its whole training, both
# from the workers' progress lines (their window rates, summed over the
# workers; the tests' own polling is not running in the fault-free run).
throughput() {
  python3 - "$2" "$WORK/run-$1" "$WORK/run-base" <<'PY'
import datetime, glob, re, sys
start = float(sys.argv[1])
def workers(run):
    out = []
    for path in sorted(glob.glob(run + "/logs/worker-*.log")):
        rows = []
        for line in open(path, errors="replace"):
            m = re.match(r"I(\d{8}) (\d\d:\d\d:\d\d\.\d+) .*progress: .* samples/s (\d+)", line)
            if m:
                t = datetime.datetime.strptime(m.group(1) + " " + m.group(2), "%Y%m%d %H:%M:%S.%f")
                rows.append((t.timestamp(), float(m.group(3))))
        out.append(rows)
    return out
def rate(ws, a, b):
    seen = [[r for t, r in w if a <= t <= b] for w in ws]
    return sum(sum(x) / len(x) for x in seen if x) if any(seen) else None
after = rate(workers(sys.argv[2]), start, start + 3)
base = rate(workers(sys.argv[3]), 0, float("inf"))
if after is not None and base:
    print(f"throughput: {after:.0f} samples/s in the 3 s after recovery, fault-free "
          f"{base:.0f} ({after / base:.2f} of it)")
else:
    print("throughput: too few progress lines to tell")
PY
}

# why NAME: what the run NAME says about its end, for a failure message:
# launch.sh's last lines, the summary's message and events, and each
# daemon's last warnings and errors.
# (The daemons' warnings first, launch.sh's own last lines last: CI shows
# the head and the tail of a long output.)
why() {
  local name="$1" f
  for f in "$WORK/run-$name"/logs/*.log; do
    [[ -f "$f" ]] || continue
    echo "--- ${f##*/}:"
    grep -E '^[EW][0-9]{4}' "$f" | tail -n 4
  done
  python3 -c "import json,sys
s = json.load(open(sys.argv[1]))
print('events:', *s.get('events', []), sep='\n  '); print('message:', s.get('message'))" \
    "$(summary "$name")" 2>/dev/null
  echo "--- $name.out (launch.sh):"
  tail -n 8 "$WORK/$name.out" 2>/dev/null
}

# wait_declared_dead ROLE INDEX: until the master no longer has that node
# ALIVE (15 s at most); sets $detected to the time, "" when it never was.
wait_declared_dead() {
  detected=""
  for _ in $(seq 1 300); do
    [[ "$(node_state "$1" "$2")" != ALIVE ]] && { detected="$(now)"; return 0; }
    sleep 0.05
  done
}

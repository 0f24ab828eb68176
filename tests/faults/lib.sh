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

# fault_config REPLICATION EPOCHS [EXTRA_YAML]: a bsp MLP job on
# Fashion-MNIST, 3 pservers and 2 workers, fast failure detection.
fault_config() {
  local replication="$1" epochs="$2" extra="${3:-}"
  BASE="$(pick_port_base)"
  write_config "$WORK/job.yaml" bsp "$epochs" "$BASE"
  sed -i "s/^  dead_timeout_ms: 2000\$/  dead_timeout_ms: 2000\n  replication: $replication/" "$WORK/job.yaml"
  [[ -n "$extra" ]] && printf '%s\n' "$extra" >> "$WORK/job.yaml"
  printf '127.0.0.1 master pserver=3 worker=2\n' > "$WORK/hosts"
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
}
wait_job() {
  local rc=0
  wait "$RUN_PID" || rc=$?
  RUN_PID=""
  return $rc
}

master_status() { curl -sf "http://127.0.0.1:$((BASE + 1))/status"; }
# pserver_version INDEX: the highest partition version pserver INDEX holds.
pserver_version() {
  curl -sf "http://127.0.0.1:$((BASE + 30 + $1))/status" | python3 -c '
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
wait_for_samples() {
  for _ in $(seq 1 600); do
    local n; n="$(job_samples 2>/dev/null || echo 0)"
    (( n >= $2 )) && return 0
    sleep 0.05
  done
  fail "$1: the job did not reach $2 samples"
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
    fail "$1: final accuracy $a is not within $tol of the fault-free run's $b"
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

# why NAME: what the run NAME says about its end, for a failure message:
# launch.sh's last lines, the summary's message and events, and each
# daemon's last warnings and errors.
why() {
  local name="$1" f
  tail -n 5 "$WORK/$name.out" 2>/dev/null
  python3 -c "import json,sys
s = json.load(open(sys.argv[1]))
print('message:', s.get('message')); print('events:', *s.get('events', []), sep='\n  ')" \
    "$(summary "$name")" 2>/dev/null
  for f in "$WORK/run-$name"/logs/*.log; do
    [[ -f "$f" ]] || continue
    echo "--- ${f##*/}:"
    grep -E '^[EW][0-9]{4}' "$f" | tail -n 4
  done
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

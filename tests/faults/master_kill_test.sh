#!/usr/bin/env bash
# SIGKILL of the master mid-job: launch.sh restarts it, it replays its state
# directory (the log and snapshot), the nodes reconnect under their ids and
# the job finishes within 1% of the fault-free run's accuracy. A second
# master started on the same state directory is refused: two masters never
# act at once.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
fault_config 1 6
baseline_then_start kill 60000
state_dir="$WORK/run-kill/master-state"
[[ -s "$state_dir/log" || -s "$state_dir/snapshot" ]] || fail "no master state in $state_dir"
# Two masters never act at once: one on the same state directory is refused.
rc=0
"$BUILD_DIR/bin/strata-master" --config "$WORK/job.yaml" --hosts "$WORK/hosts" \
  --port 0 --http_port -1 --state_dir "$state_dir" > "$WORK/second.log" 2>&1 || rc=$?
(( rc == 1 )) || fail "a second master on the same state directory exited $rc"
grep -q 'held by another strata-master (pid [0-9]' "$WORK/second.log" ||
  fail "the second master does not say why: $(tail -3 "$WORK/second.log")"

t0="$(now)"
kill -KILL "$(pid_of kill master-0)"
back=""
for _ in $(seq 1 300); do  # 15 s at most
  if master_status > /dev/null 2>&1; then back="$(now)"; break; fi
  sleep 0.05
done
[[ -n "$back" ]] || fail "the master did not come back within 15 s"
wait_job || fail "the job failed after the master was killed: $(why kill)"
s="$(summary kill)"
grep -q 'master-0 failed (code 137); restarting' "$WORK/kill.out" || fail "the master was not restarted"
grep -q 'master restarted (restart 1): state of epoch' "$s" || fail "no replay event: $(cat "$s")"
[[ "$(summary_field kill tasks_done)" == "$(summary_field kill tasks_total)" ]] || fail "data tasks lost"
[[ "$(ledger_field kill lost)" == 0 ]] || fail "acknowledged updates lost: $(cat "$s")"
# No node was taken for dead on the way.
grep -q 'declared dead' "$s" && fail "nodes were declared dead across the restart: $(cat "$s")"
assert_accuracy_close kill base
echo "master back (answering) $(secs "$t0" "$back") s after the kill; ledger: $(ledger_field kill acked) acknowledged, 0 lost"
throughput kill "$back"
assert_nothing_left "$WORK"

#!/usr/bin/env bash
# Pipeline stages (model.stages: 2, docs/reliability.md "Pipeline
# stages"): a bsp MLP job whose 2 stages are one group of 2 workers. The
# fault-free run trains to its accuracy through the group. Then stage 1's
# worker is SIGKILLed mid-training: the leader's step fails, and it tries
# the step again (a new attempt) once the group is whole again; the master
# declares the worker dead and launch.sh restarts it, which takes stage 1
# as a new node. No data task is lost and the accuracy stays within 1% of
# the fault-free run's. Under mTLS in the suite (tests/faults/
# CMakeLists.txt): the stages prove their membership to each other on the
# data plane, and the key epoch moves when the worker dies.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
fault_config 0 2
use_sgd
sed -i 's/^  activation: relu$/  activation: relu\n  stages: 2/' "$WORK/job.yaml"
grep -q '^  stages: 2$' "$WORK/job.yaml" || fail "no model section to change"
printf '127.0.0.1 master pserver=1 worker=2\n' > "$WORK/hosts"

# stage1_of NAME: the index of the worker that took stage 1 first.
stage1_of() {
  grep -l "pipeline: stage 1 of 2" "$WORK/run-$1"/logs/worker-*.log 2>/dev/null | head -1 |
    sed 's/.*worker-\([0-9]*\)\.log$/\1/'
}

run_job base || fail "the fault-free run failed: $(why base)"
[[ -n "$(stage1_of base)" ]] || fail "no worker took stage 1 in the fault-free run: $(why base)"
! grep -q "pipeline: step .* failed" "$WORK"/run-base/logs/worker-*.log ||
  fail "a step failed in the fault-free run: $(why base)"
(( $(python3 -c "print(int($(accuracy base) * 1000))") >= 800 )) ||
  fail "the fault-free run reached $(accuracy base) test accuracy (< 0.80)"

start_job kill
wait_for_samples kill 40000
w="$(stage1_of kill)"
[[ -n $w ]] || fail "no worker took stage 1: $(why kill)"
leader=$((1 - w))
t0="$(now)"
kill -KILL "$(pid_of kill "worker-$w")"
expect_training_goes_on kill "training stalled after stage 1's worker died"
wait_job || fail "the job failed after the kill: $(why kill)"
grep -q "worker-$w failed (code 137); restarting" "$WORK/kill.out" || fail "worker $w was not restarted"
logs="$WORK/run-kill/logs"
grep -q "pipeline: step [0-9]* failed" "$logs/worker-$leader.log" ||
  fail "the leader's step did not fail: $(grep pipeline "$logs/worker-$leader.log" | tail -5)"
(( $(grep -c "pipeline: stage 1 of 2" "$logs/worker-$w.log") >= 2 )) ||
  fail "the restarted worker $w did not take stage 1: $(tail -20 "$logs/worker-$w.log")"
[[ "$(summary_field kill tasks_done)" == "$(summary_field kill tasks_total)" ]] ||
  fail "data tasks lost: $(summary_field kill tasks_done) of $(summary_field kill tasks_total) done"
(( $(summary_field kill records_done) == 2 * 60000 )) ||
  fail "$(summary_field kill records_done) records in completed tasks, expected $((2 * 60000))"
assert_accuracy_close kill base
echo "steps tried again by the leader: $(grep -c 'pipeline: step [0-9]* failed' "$logs/worker-$leader.log")"
throughput kill "$t0"
assert_nothing_left "$WORK"

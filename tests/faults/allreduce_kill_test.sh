#!/usr/bin/env bash
# Dense tables by allreduce among the workers (model.dense_sync: allreduce,
# docs/reliability.md "Dense tables by allreduce"): a bsp MLP job on a
# ring of 3 workers, its optimizer sharded over them, the pserver holding
# none of the tables. The fault-free run trains to its accuracy with every
# step through the ring. Then worker 1 is SIGKILLed mid-training: the
# others' step fails, the master's next view leaves it out, the ring
# re-forms with the 2 left (the dead worker's optimizer shard from its
# replica on the next worker) and the step is retried; launch.sh restarts
# the worker, which comes back into the ring at a step boundary. No data
# task is lost and the accuracy stays within 1% of the fault-free run's.
# The suite runs it under mTLS (tests/faults/CMakeLists.txt): the workers
# prove their membership to each other on the data plane, and the key
# epoch moves when worker 1 dies.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
fault_config 0 3
# (As worker_kill_test: the restarted worker's task boundaries move.)
use_sgd
sed -i 's/^  activation: relu$/  activation: relu\n  dense_sync: allreduce/' "$WORK/job.yaml"
grep -q '^  dense_sync: allreduce$' "$WORK/job.yaml" || fail "no model section to change"
printf '127.0.0.1 master pserver=1 worker=3\n' > "$WORK/hosts"

run_job base || fail "the fault-free run failed: $(why base)"
# Every step went through the ring of the 3 workers; the pserver held no
# table.
for w in 0 1 2; do
  grep -q "dense allreduce: ring of view [0-9]*: nodes [0-9]*, [0-9]*, [0-9]*," \
    "$WORK/run-base/logs/worker-$w.log" || fail "worker $w formed no ring of 3: $(why base)"
  ! grep -q "dense allreduce: step .* failed" "$WORK/run-base/logs/worker-$w.log" ||
    fail "a step failed in the fault-free run: $(why base)"
  # (Its steps overlap the backward pass: model.allreduce_bucket_kib.)
  grep -q "dense allreduce: steps overlap the backward pass" "$WORK/run-base/logs/worker-$w.log" ||
    fail "worker $w stepped no ring step with the backward pass: $(why base)"
done
grep -q "placed 0 partition(s) of 4 table(s)" "$WORK/run-base/logs/master-0.log" ||
  fail "the pservers were given partitions of allreduce tables: $(grep placed "$WORK/run-base/logs/master-0.log")"
(( $(python3 -c "print(int($(accuracy base) * 1000))") >= 800 )) ||
  fail "the fault-free run reached $(accuracy base) test accuracy (< 0.80)"

start_job kill
wait_for_samples kill 40000
t0="$(now)"
kill -KILL "$(pid_of kill worker-1)"
# The others train on (the ring re-forms without it; no hang on the step).
expect_training_goes_on kill "training stalled after the worker died"
wait_job || fail "the job failed after the kill: $(why kill)"
grep -q 'worker-1 failed (code 137); restarting' "$WORK/kill.out" || fail "worker 1 was not restarted"
logs="$WORK/run-kill/logs"
# The survivors re-formed without it, then with its restart: or at once
# with its restart, when the restart was in the view by the time they
# re-formed (the ring of the newest view is the one formed).
(( $(grep -c "dense allreduce: ring of view" "$logs/worker-0.log") >= 2 )) &&
  grep -q "dense allreduce: step .* failed" "$logs/worker-0.log" ||
  fail "worker 0 formed no new ring after a failed step: $(grep 'dense allreduce' "$logs/worker-0.log" | tail -8)"
grep -q "dense allreduce: ring of view" "$logs/worker-1.log" ||
  fail "the restarted worker 1 never joined a ring: $(tail -20 "$logs/worker-1.log")"
[[ "$(summary_field kill tasks_done)" == "$(summary_field kill tasks_total)" ]] ||
  fail "data tasks lost: $(summary_field kill tasks_done) of $(summary_field kill tasks_total) done"
(( $(summary_field kill records_done) == 3 * 60000 )) ||
  fail "$(summary_field kill records_done) records in completed tasks, expected $((3 * 60000))"
assert_accuracy_close kill base
echo "rings formed by worker 0: $(grep -c 'dense allreduce: ring of view' "$logs/worker-0.log");" \
  "steps failed and retried there: $(grep -c 'dense allreduce: step .* failed' "$logs/worker-0.log")"
throughput kill "$t0"
assert_nothing_left "$WORK"

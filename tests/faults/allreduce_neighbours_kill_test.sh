#!/usr/bin/env bash
# Dense tables by allreduce, two neighbours of the ring lost at once
# (docs/reliability.md, "Dense tables by allreduce"): a bsp MLP job with
# Adam on a ring of 3 workers, the optimizer state sharded over them, each
# shard's replica on the next worker, and ring checkpoints every 100 steps.
# After the first checkpoint, workers 1 and 2 are SIGKILLed together: one
# segment's owner and replica are both gone, and the ring re-formed takes
# that segment's optimizer state from the newest checkpoint (not zeros:
# Adam's moments from zero would make its first updates lr-sized for every
# parameter of the segment). launch.sh restarts both; no data task is
# lost and the job reaches its accuracy.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
fault_config 0 2 "checkpoint:
  dir: $WORK/ckpt
  every_steps: 100
  every_seconds: 0
  on_finish: false"
sed -i 's/^  activation: relu$/  activation: relu\n  dense_sync: allreduce/' "$WORK/job.yaml"
grep -q '^  dense_sync: allreduce$' "$WORK/job.yaml" || fail "no model section to change"
grep -q '^  type: adam$' "$WORK/job.yaml" || fail "the job's optimizer is not Adam (no state to lose)"
printf '127.0.0.1 master pserver=1 worker=3\n' > "$WORK/hosts"

start_job kill
for _ in $(seq 1 600); do
  compgen -G "$WORK/ckpt/ckpt-*/ring-*" > /dev/null &&
    compgen -G "$WORK/ckpt/ckpt-*/MANIFEST" > /dev/null && break
  sleep 0.05
done
compgen -G "$WORK/ckpt/ckpt-*/MANIFEST" > /dev/null || fail "no checkpoint was written: $(why kill)"
wait_for_samples kill 40000
kill -KILL "$(pid_of kill worker-1)" "$(pid_of kill worker-2)"
expect_training_goes_on kill "training stalled after two workers died"
wait_job || fail "the job failed after the kill: $(why kill)"
logs="$WORK/run-kill/logs"
grep -q "optimizer-state floats lost with their owner and replica, taken from checkpoint [0-9]*" \
  "$logs/worker-0.log" ||
  fail "worker 0's ring took no lost state from a checkpoint: $(grep 'dense allreduce' "$logs/worker-0.log" | tail -8)"
grep -q "the optimizer state of segments whose owner and replica left together comes from checkpoint" \
  "$logs/worker-0.log" || fail "worker 0 did not read the checkpoint itself (the only member left)"
[[ "$(summary_field kill tasks_done)" == "$(summary_field kill tasks_total)" ]] ||
  fail "data tasks lost: $(summary_field kill tasks_done) of $(summary_field kill tasks_total) done"
(( $(python3 -c "print(int($(accuracy kill) * 1000))") >= 820 )) ||
  fail "the job reached $(accuracy kill) test accuracy (< 0.82)"
echo "$(grep -o 'optimizer-state floats lost.*' "$logs/worker-0.log" | head -1); accuracy $(accuracy kill)"
assert_nothing_left "$WORK"

#!/usr/bin/env bash
# Dense tables by allreduce, the worker chosen to evaluate the trained
# model killed while it evaluates (docs/reliability.md, "The job's end"):
# a bsp MLP job on a ring of 3 workers. Once every data task is done the
# master gives the evaluation to the first worker that asks, and the
# others leave their ring steps (no ring forms again). The test images
# are a symlink to the real file (launch.sh's check of the config reads
# them); once training runs it is swapped for a FIFO, so the chosen worker
# blocks opening them (the test set is read at evaluation time), and it is
# SIGKILLed there. The symlink is put back. Once the killed worker has
# left the job (declared dead), the master gives the evaluation to the
# next worker that asks and holds the ring's parameters; the killed
# worker's restart holds none (it was in no ring when training ended) and
# waits. The job succeeds, and its accuracy is the trained model's. Then
# a ring of 1 the same way: without checkpoints nobody can evaluate, and
# the job fails at once saying so; with them, the restart restores the
# final checkpoint and evaluates the trained model.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
fault_config 0 1
sed -i 's/^  activation: relu$/  activation: relu\n  dense_sync: allreduce/' "$WORK/job.yaml"
grep -q '^  dense_sync: allreduce$' "$WORK/job.yaml" || fail "no model section to change"
images="$(sed -n 's/^  test_images: //p' "$WORK/job.yaml")"
[[ -f $images ]] || fail "no test images in the config: $(cat "$WORK/job.yaml")"
link="$WORK/test-images-idx3-ubyte.gz"
ln -s "$images" "$link"
sed -i "s|^  test_images: .*|  test_images: $link|" "$WORK/job.yaml"
printf '127.0.0.1 master pserver=1 worker=3\n' > "$WORK/hosts"

start_job eval
logs="$WORK/run-eval/logs"
# (The master is up: launch.sh has checked the config.)
mkfifo "$WORK/fifo.tmp"
mv -T "$WORK/fifo.tmp" "$link"
first=""
for _ in $(seq 1 1800); do
  first="$(sed -n 's/.*node \([0-9]*\) evaluates the trained model.*/\1/p' "$logs/master-0.log" 2>/dev/null | head -n 1 || true)"
  [[ -n $first ]] && break
  kill -0 "$RUN_PID" 2>/dev/null || fail "the job ended before an evaluator was chosen: $(why eval)"
  sleep 0.1
done
[[ -n $first ]] || fail "no worker was chosen to evaluate: $(why eval)"
victim="$(grep -l "is node $first;" "$logs"/worker-*.log | sed 's/.*worker-\([0-9]*\)\.log/\1/' | head -n 1)"
[[ -n $victim ]] || fail "node $first is no worker's: $(grep -h 'is node' "$logs"/worker-*.log)"
# (It blocks opening the FIFO: no writer yet.)
sleep 1
grep -q "evaluation: test accuracy" "$logs/worker-$victim.log" &&
  fail "worker $victim evaluated before it was killed"
kill -KILL "$(pid_of eval "worker-$victim")"
ln -s "$images" "$WORK/link.tmp"
mv -T "$WORK/link.tmp" "$link"
# The killed worker's restart may ask first: it holds no ring's parameters
# and declines (it must not fail); another worker evaluates.
for _ in $(seq 1 600); do
  grep -q "evaluates the trained model (node $first, chosen before, left)" "$logs/master-0.log" && break
  kill -0 "$RUN_PID" 2>/dev/null || break
  sleep 0.1
done
wait_job || fail "the job failed after its evaluator was killed: $(why eval)"
[[ "$(summary_field eval tasks_done)" == "$(summary_field eval tasks_total)" ]] ||
  fail "data tasks lost: $(summary_field eval tasks_done) of $(summary_field eval tasks_total) done"
(( $(python3 -c "print(int($(accuracy eval) * 1000))") >= 800 )) ||
  fail "the evaluation gave $(accuracy eval) test accuracy (< 0.80): not the trained model's"
grep -q "worker-$victim failed (code 137); restarting" "$WORK/eval.out" ||
  fail "worker $victim was not restarted: $(tail -5 "$WORK/eval.out")"
! grep -q "worker-$victim failed (code 1)" "$WORK/eval.out" ||
  fail "worker $victim's restart failed: $(grep -h "worker failed" "$logs/worker-$victim.log")"
grep -q "evaluates the trained model (node $first, chosen before, left)" "$logs/master-0.log" ||
  fail "the evaluation was not given to another worker: $(grep -h 'evaluat' "$logs/master-0.log")"
evaluator="$(grep -l "evaluation: test accuracy" "$logs"/worker-*.log | sed 's/.*worker-\([0-9]*\)\.log/\1/')"
[[ -n $evaluator && $evaluator != "$victim" ]] ||
  fail "worker '$evaluator' evaluated, not one that holds the ring's parameters"
declined=""
if grep -q "cannot evaluate the trained model" "$logs/master-0.log"; then declined=" (its restart declined)"; fi
echo "node $first (worker $victim) killed while evaluating$declined; worker $evaluator evaluated: accuracy $(accuracy eval)"

# solo NAME: a ring of 1 whose evaluator is killed as above, its restart
# the only worker; waits for the job's end (its status in $solo_rc).
solo() {
  printf '127.0.0.1 master pserver=1 worker=1\n' > "$WORK/hosts"
  start_job "$1"
  local l="$WORK/run-$1/logs"
  mkfifo "$WORK/fifo.tmp"
  mv -T "$WORK/fifo.tmp" "$link"
  for _ in $(seq 1 1800); do
    grep -q "evaluates the trained model" "$l/master-0.log" 2>/dev/null && break
    kill -0 "$RUN_PID" 2>/dev/null || fail "$1: the job ended before an evaluator was chosen: $(why "$1")"
    sleep 0.1
  done
  sleep 1
  kill -KILL "$(pid_of "$1" worker-0)"
  ln -s "$images" "$WORK/link.tmp"
  mv -T "$WORK/link.tmp" "$link"
  solo_rc=0
  wait_job || solo_rc=$?
  ! grep -q "restart budget spent" "$WORK/$1.out" || fail "$1: the worker was restarted until launch.sh gave up"
}

# 2. A ring of 1 without checkpoints: the restart forms a ring of its own
#    initial values, which are not the trained model; it declines, and
#    nobody can evaluate: the master fails the job saying so (not a
#    restart loop, nor an untrained model's accuracy).
solo solo
(( solo_rc != 0 )) || fail "solo: the job succeeded, yet no worker held the trained model: accuracy $(accuracy solo)"
grep -q "before the job's last step" "$WORK/run-solo/logs/worker-0.log" ||
  fail "solo: the restart did not decline: $(grep -h 'evaluat' "$WORK/run-solo/logs/worker-0.log" | tail -3)"
message="$(summary_field solo message)"
[[ $message == *"no worker in the job holds the trained model's dense allreduce tables"*"no checkpoint holds the trained model"*"the trained allreduce tables are lost" ]] ||
  fail "solo: the job failed otherwise: $message"
echo "a ring of 1 whose evaluator was killed: the job failed saying: $message"

# 3. The same, checkpointed: the restart's ring restores the final
#    checkpoint, which holds the trained model, and it evaluates that.
printf 'checkpoint:\n  dir: %s\n  every_seconds: 3600\n' "$WORK/ckpt" >> "$WORK/job.yaml"
solo solo-ckpt
(( solo_rc == 0 )) || fail "solo-ckpt: the job failed: $(why solo-ckpt)"
(( $(python3 -c "print(int($(accuracy solo-ckpt) * 1000))") >= 800 )) ||
  fail "solo-ckpt: the evaluation gave $(accuracy solo-ckpt) test accuracy (< 0.80): not the trained model's"
echo "a ring of 1 whose evaluator was killed, checkpointed: its restart evaluated the final checkpoint's model: accuracy $(accuracy solo-ckpt)"
assert_nothing_left "$WORK"

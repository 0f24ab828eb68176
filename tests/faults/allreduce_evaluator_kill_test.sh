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
# waits. The job succeeds, and its accuracy is the trained model's.
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
assert_nothing_left "$WORK"

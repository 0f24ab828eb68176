#!/usr/bin/env bash
# Real binaries through scripts/launch.sh on 127.0.0.1: 1 master, 2 pservers,
# 2 workers train the Fashion-MNIST MLP (784-128-10, 2 epochs) in bsp, ssp
# (staleness 3) or asp (argument 1), or as 2 pipeline stages of a bsp job
# (model.stages: 2, one worker each: argument "pipeline"; under mTLS in the
# suite), and must reach 84% test accuracy;
# launch.sh must exit 0, write
# summary.json with the promised fields and each daemon's log, and leave
# nothing running.
BUILD_DIR="$1"; MODE="$2"
source "$(dirname "$0")/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"

work="$(mktemp -d /tmp/strata-e2e-launch-XXXXXX)"
trap 'pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
if [[ $MODE == pipeline ]]; then
  write_config "$work/job.yaml" bsp 2 "$(pick_port_base)"
  sed -i 's/^  activation: relu$/  activation: relu\n  stages: 2\n  micro_batches: 4/' "$work/job.yaml"
else
  write_config "$work/job.yaml" "$MODE" 2 "$(pick_port_base)"
fi
printf '# e2e\n127.0.0.1 master pserver=2 worker=2\n' > "$work/hosts"

"$ROOT/scripts/launch.sh" run --config "$work/job.yaml" --hosts "$work/hosts" \
  --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" --timeout 600 | tee "$work/out" ||
  fail "launch.sh run exited non-zero"

s="$work/run/summary.json"
[[ -f $s ]] || fail "no summary.json"
cat "$s"
[[ "$(json_field "$s" state)" == succeeded ]] || fail "state is not succeeded"
for k in final_test_accuracy steps samples_per_sec comm_share wall_seconds train_seconds; do
  [[ -n "$(json_field "$s" $k)" ]] || fail "summary.json lacks $k"
done
acc="$(json_field "$s" final_test_accuracy)"
python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.84 else 1)" ||
  fail "test accuracy $acc < 0.84"
python3 -c "import sys; c=float('$(json_field "$s" comm_share)'); sys.exit(0 if 0 < c < 1 else 1)" ||
  fail "comm_share out of (0, 1)"
grep -qE '^progress: epoch [0-9]+/[0-9]+  step [0-9]+  tasks [0-9]+/[0-9]+  samples/s' "$work/out" ||
  fail "no job progress lines shown"
# The workers' own progress lines stay in their logs.
! grep -q 'progress: worker' "$work/out" || fail "per-worker progress lines shown"
if [[ $MODE == pipeline ]]; then
  # Worker 0 leads (index 0); worker 1 is stage 1.
  grep -q 'progress: worker' "$work/run/logs/worker-0.log" "$work/run/logs/worker-1.log" ||
    fail "no progress lines in the workers' logs"
  grep -q 'pipeline: stage 1 of 2' "$work/run/logs/worker-0.log" "$work/run/logs/worker-1.log" ||
    fail "no worker took stage 1"
else
  grep -q 'progress: worker' "$work/run/logs/worker-0.log" || fail "no progress lines in worker 0's log"
fi
for d in master-0 pserver-0 pserver-1 worker-0 worker-1; do
  [[ -s "$work/run/logs/$d.log" ]] || fail "no log for $d"
done
assert_nothing_left "$work"
echo "PASS: $MODE accuracy $acc"

#!/usr/bin/env bash
# The Fashion-MNIST MLP (784-128-10, 2 epochs, bsp) trained by real daemons
# through scripts/launch.sh twice: the worker on the GPU (worker.device:
# cuda, TF32 off) and on the CPU, same seed. The GPU run must reach the CPU
# run's test accuracy within 1%, and the worker must say it used the GPU.
# Skipped (77), saying why, where there is no GPU (docs/gpu.md).
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
why="$("$BUILD_DIR/bin/strata-step-bench" --device cuda --layers 4,2 --batch 1 --steps 1 2>&1)" ||
  skip "no GPU to train on: ${why##*strata-step-bench: }"

work="$(mktemp -d /tmp/strata-e2e-gpu-XXXXXX)"
trap 'pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
printf '127.0.0.1 master pserver=1 worker=1\n' > "$work/hosts"
for device in cpu cuda; do
  write_config "$work/$device.yaml" bsp 2 "$(pick_port_base)"
  printf 'worker:\n  device: %s\n  precision: fp32\n' "$device" >> "$work/$device.yaml"
  "$ROOT/scripts/launch.sh" run --config "$work/$device.yaml" --hosts "$work/hosts" \
    --run-dir "$work/run-$device" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 600 \
    > "$work/$device.out" 2>&1 || fail "the $device run failed: $(tail -n 5 "$work/$device.out")"
done
grep -q 'device: cuda:' "$work/run-cuda/logs/worker-0.log" ||
  fail "the worker does not say it trained on the GPU: $(grep -m1 'device' "$work/run-cuda/logs/worker-0.log")"
gpu="$(json_field "$work/run-cuda/summary.json" final_test_accuracy)"
cpu="$(json_field "$work/run-cpu/summary.json" final_test_accuracy)"
python3 -c "import sys; sys.exit(0 if abs($gpu - $cpu) <= 0.01 else 1)" ||
  fail "GPU accuracy $gpu is not within 0.01 of the CPU's $cpu"
assert_nothing_left "$work"
echo "PASS: GPU accuracy $gpu, CPU $cpu; $(grep -m1 'device: cuda:' "$work/run-cuda/logs/worker-0.log" | sed 's/.*\] //')"

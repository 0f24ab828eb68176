#!/usr/bin/env bash
# job.batch_split by_speed with real daemons (docs/consistency.md,
# "Heterogeneous workers"): a bsp job of 2 workers, of which worker 1 is
# slowed to a tenth of a core by a cgroup CPU quota once it trains (the
# MLP, 784-512-10, and the batch, 256 a worker, are large enough that
# compute dominates its steps, as on a slow device). The
# master measures both workers' compute speeds from their progress reports
# and splits the global batch of 512 by them: the slowed worker's share
# must drop below the other's, the shares must sum to 512 (a step still
# trains the global batch: samples per step measured over the job's
# counters), and the job must finish with every record trained, nothing
# acknowledged lost and the accuracy of a trained model. The fast
# worker's share of step time spent waiting before and after the split is
# printed (bench/batch_split_bench.sh measures it against an even split).
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
work="$(mktemp -d /tmp/strata-e2e-split-XXXXXX)"
cg=""
cleanup() {
  "$ROOT/scripts/launch.sh" down --run-dir "$work/run" >/dev/null 2>&1 || true
  pkill -KILL -f -- "$work" 2>/dev/null || true
  if [[ -n "$cg" && -d "$cg" ]]; then
    for _ in $(seq 1 50); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
# A cgroup with 10 ms of CPU per 100 ms: cgroup v1's cpu controller or v2.
if [[ -w /sys/fs/cgroup/cpu ]]; then
  cg="/sys/fs/cgroup/cpu/strata-split-$$"
  { mkdir "$cg" && echo 10000 > "$cg/cpu.cfs_quota_us"; } || fail "cannot make cgroup $cg"
elif [[ -w /sys/fs/cgroup/cgroup.subtree_control ]]; then
  cg="/sys/fs/cgroup/strata-split-$$"
  echo +cpu > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  { mkdir "$cg" && echo "10000 100000" > "$cg/cpu.max"; } || fail "cannot make cgroup $cg"
else
  fail "no writable cgroup cpu controller to slow a worker with (as root, v1 or v2)"
fi

base="$(pick_port_base)"
write_config "$work/job.yaml" bsp 3 "$base" 0
sed -i 's/^  consistency: bsp$/  consistency: bsp\n  batch_split: by_speed/; s/^  progress_every_steps: 100$/  progress_every_steps: 10/; s/^  layers: \[784, 128, 10\]$/  layers: [784, 512, 10]/; s/^  batch_size: 64$/  batch_size: 256/' "$work/job.yaml"
grep -q '^  layers: \[784, 512, 10\]$' "$work/job.yaml" || fail "the model was not widened"
printf '127.0.0.1 master pserver=1 worker=2\n' > "$work/hosts"
master="127.0.0.1:$base"
"$ROOT/scripts/launch.sh" run --config "$work/job.yaml" --hosts "$work/hosts" \
  --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 240 > "$work/run.out" 2>&1 &
launcher=$!
wait_steps "$master" 5
read -r _ pid1 < "$work/run/pids/worker-1"
echo "$pid1" > "$cg/cgroup.procs" || fail "cannot move worker 1 (pid $pid1) into $cg"

# waits INDEX: worker INDEX's seconds training and waiting so far.
waits() {
  http_get "127.0.0.1:$((base + 40 + $1))/metrics" |
    awk '/^strata_worker_busy_seconds /{b=$2} /^strata_worker_comm_seconds /{c=$2} END{print b, c}'
}
# samples_step: each worker's samples and last step, now.
samples_step() {
  python3 - "$base" <<'PY'
import json, sys, urllib.request
base = int(sys.argv[1])
st = [json.load(urllib.request.urlopen(f'http://127.0.0.1:{base + 40 + i}/status', timeout=5))
      for i in (0, 1)]
print(st[0]['samples'], st[1]['samples'], st[0]['last_step'], st[1]['last_step'])
PY
}
# The split the master made once it measured the slowed worker: worker 1's
# share below worker 0's (at most 60 s).
split=""
for _ in $(seq 1 600); do
  split="$(python3 - "$work/run/events.jsonl" <<'PY'
import json, re, sys
last = None
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e['kind'] == 'batch_split' and 'not measured' not in e['message']:
        last = e['message']
if last:
    shares = {int(w): int(n) for n, w in re.findall(r'(\d+) \(worker (\d+),', last)}
    if shares.get(1, 1 << 30) < shares.get(0, 0):
        print(last)
PY
)"
  [[ -n "$split" ]] && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
[[ -n "$split" ]] || fail "no batch split by speed giving the slowed worker less: $(grep batch_split "$work/run/events.jsonl" | tail -n 3)"
echo "$split"
read -r b0 c0 <<< "$(waits 0)"
python3 - "$split" <<'PY' || fail "the split does not sum to the global batch: $split"
import re, sys
shares = [int(n) for n, _ in re.findall(r'(\d+) \(worker (\d+),', sys.argv[1])]
assert sum(shares) == 512 and len(shares) == 2, shares
PY
# Once both workers are on tasks leased after the split, a step trains
# the global batch: samples per step over a window, read from the workers.
# (Each data task of 2000 records ends on a short step, so a worker whose
# share is b trains 2000 / ceil(2000 / b) a step on average: the expected
# figure is the sum of those.)
# (3 s: the two workers' counters are read one after the other, so the
# window's ends are off by up to a step of one worker; under a loaded
# suite 1.5 s held 58 steps, and that edge alone was 2.7 samples a step.)
sleep 1
before="$(samples_step)"
sleep 3
after="$(samples_step)"
python3 - "$before" "$after" "$split" <<'PY' || fail "samples per step after the split is not the global batch"
import math, re, sys
a0, a1, t0, u0 = map(int, sys.argv[1].split())
b0, b1, t1, u1 = map(int, sys.argv[2].split())
shares = [int(n) for n, _ in re.findall(r'(\d+) \(worker (\d+),', sys.argv[3])]
expected = sum(2000 / math.ceil(2000 / b) for b in shares)
per = (b0 - a0 + b1 - a1) / max(1, t1 - t0)
print("samples per bsp step after the split: %.1f over %d steps (expected %.1f: %s a step, "
      "less each task's short last step); worker 0: %d samples in %d steps, worker 1: %d in %d"
      % (per, t1 - t0, expected, " + ".join(map(str, shares)), b0 - a0, t1 - t0, b1 - a1, u1 - u0))
# (10%: the two workers are read one after the other, the slowed one's
# page answering late under its CPU quota, so the window's ends are a step
# of either apart; the whole global batch given to each would be 2x off.)
sys.exit(0 if t1 > t0 and abs(per / expected - 1) <= 0.10 else 1)
PY
read -r b1 c1 <<< "$(waits 0)"
python3 -c "print('worker 0 waited %.0f%% of its step time until the split, %.0f%% in the 4 s after' % (100 * $c0 / $b0, 100 * ($c1 - $c0) / max(1e-9, $b1 - $b0)))"
echo "$(grep -c '"kind": "batch_split"' "$work/run/events.jsonl") batch splits made so far"

for _ in $(seq 1 2400); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
set +e; wait "$launcher"; rc=$?; set -e
(( rc == 0 )) || { tail -n 30 "$work/run.out"; fail "the job exited $rc"; }
check_job "$work/run/summary.json" "by_speed job" $((3 * 60000)) 0.80
assert_nothing_left "$work"
echo "PASS: the global batch split by speed"

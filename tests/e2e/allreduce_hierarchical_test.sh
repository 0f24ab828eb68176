#!/usr/bin/env bash
# Hierarchical allreduce (model.dense_sync: allreduce with
# cluster.aggregation: node; docs/architecture.md, "Collectives"): a bsp
# MLP job on two hosts of 2 workers each (127.0.0.1 and 127.0.0.2, both
# loopback, each with a shared-memory segment of its own). The workers of
# a host sum their gradients in the segment; the host's lowest worker
# steps the sum through a ring of one worker per host (2 members, not 4),
# with the optimizer sharded over those 2, and publishes the parameters
# for its host. The pserver holds no table. The job trains to its
# accuracy with every record trained. Then the aggregating worker of the
# second host is SIGKILLed: the other worker of that host takes over its
# host's sum and its seat in the ring (the ring re-forms, the killed
# member's optimizer shard from its replica), launch.sh restarts the
# killed one, and the job ends with every data task done. Then the CTR
# workload on hosts of 3 workers and 1, its sparse rows on 2 pservers,
# checkpointed.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
work="$(mktemp -d /tmp/strata-e2e-hier-XXXXXX)"
# (The segments this test's jobs mapped, named in their workers' logs: not
# those of another test running beside it.)
cleanup() {
  for r in a b c; do "$ROOT/scripts/launch.sh" down --run-dir "$work/run-$r" >/dev/null 2>&1 || true; done
  pkill -KILL -f -- "$work" 2>/dev/null || true
  grep -ho "aggregation through /strata-agg-[0-9a-f]*-127\.0\.0\.[12]" "$work"/run-*/logs/worker-*.log 2>/dev/null |
    sed 's|.* /|/dev/shm/|' | sort -u | xargs -r rm -f
  [[ -n ${KEEP_WORK:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
printf '127.0.0.1 master pserver=1 worker=2\n127.0.0.2 worker=2\n' > "$work/hosts"

# config FILE: 2 epochs of 24000 images in tasks of 2000, batches of 32.
config() {
  write_config "$1" bsp 2 "$(pick_port_base)" 24000
  sed -i "s/^  activation: relu\$/  activation: relu\n  dense_sync: allreduce/; s/^  batch_size: 64\$/  batch_size: 32/; s/^cluster:\$/cluster:\n  aggregation: node/" "$1"
  grep -q '^  dense_sync: allreduce$' "$1" && grep -q '^  aggregation: node$' "$1" ||
    fail "config: $(cat "$1")"
}
leaders() {  # leaders RUN: the worker indices whose log says they aggregate
  grep -l "now aggregates the gradients of host" "$1"/logs/worker-*.log | sed 's/.*worker-\([0-9]*\)\.log/\1/'
}
# steady_leaders RUN W...: with no fault, the workers W (one a host) are
# the only ones that ever aggregated, none of them handed over, and each
# formed its ring once (a worker that finished first stayed a member).
steady_leaders() {
  local run="$1" w n
  shift
  (( $# == 2 )) || fail "$run: aggregating workers $*, not one a host"
  ! grep -l "no longer aggregates the gradients" "$run"/logs/worker-*.log ||
    fail "$run: a host's aggregation moved without a fault: $(grep -h "aggregates the gradients" "$run"/logs/worker-*.log)"
  for w in "$@"; do
    n="$(grep -c "dense allreduce: ring of view" "$run/logs/worker-$w.log")"
    (( n == 1 )) || fail "$run: worker $w formed $n rings, not 1: $(grep "dense allreduce" "$run/logs/worker-$w.log" | head -8)"
  done
}

# 1. Fault-free.
config "$work/a.yaml"
"$ROOT/scripts/launch.sh" run --config "$work/a.yaml" --hosts "$work/hosts" --run-dir "$work/run-a" \
  --bin-dir "$BUILD_DIR/bin" --quiet --timeout 150 > "$work/a.out" 2>&1 ||
  { tail -n 30 "$work/a.out"; for f in "$work"/run-a/logs/*.log; do echo "== $f"; tail -n 15 "$f"; done; fail "the hierarchical run failed"; }
logs="$work/run-a/logs"
check_job "$work/run-a/summary.json" "hierarchical allreduce" 48000 0.74
grep -q "placed 0 partition(s) of 4 table(s)" "$logs/master-0.log" ||
  fail "the pserver was given partitions of allreduce tables: $(grep placed "$logs/master-0.log")"
# An aggregating worker per host (its lowest; one that runs out of data
# tasks while the other trains keeps its seat and optimizer shards); they,
# and only they, form rings, of 2 members, once each.
mapfile -t lead < <(leaders "$work/run-a")
steady_leaders "$work/run-a" "${lead[@]}"
hosts_led="$(grep -ho "now aggregates the gradients of host 127.0.0.[12]" "$logs"/worker-*.log | sort -u | wc -l)"
(( hosts_led == 2 )) || fail "the aggregating workers (${lead[*]:-none}) do not stand for both hosts"
for w in 0 1 2 3; do
  if [[ " ${lead[*]} " == *" $w "* ]]; then
    grep -q "dense allreduce: ring of view [0-9]*: nodes [0-9]*, [0-9]*, this one" "$logs/worker-$w.log" ||
      fail "aggregating worker $w formed no ring of 2: $(grep 'dense allreduce' "$logs/worker-$w.log" | tail -5)"
    ! grep -qE "dense allreduce: ring of view [0-9]+: nodes [0-9]+, [0-9]+, [0-9]+" "$logs/worker-$w.log" ||
      fail "worker $w formed a ring of more than the 2 hosts"
  else
    ! grep -q "dense allreduce: ring of view" "$logs/worker-$w.log" ||
      fail "worker $w, which never aggregated, joined a ring"
  fi
done
grep -q "hierarchical: each host's sum first" "$logs/worker-0.log" || fail "worker 0 does not say the ring is hierarchical"
acc_a="$(json_field "$work/run-a/summary.json" final_test_accuracy)"
echo "ok: 2 hosts x 2 workers, a ring of 2 (workers ${lead[*]} aggregating): accuracy $acc_a"

# 2. The second host's aggregating worker killed mid-training.
config "$work/b.yaml"
master="127.0.0.1:$(sed -n 's/^    master: //p' "$work/b.yaml")"
"$ROOT/scripts/launch.sh" run --config "$work/b.yaml" --hosts "$work/hosts" --run-dir "$work/run-b" \
  --bin-dir "$BUILD_DIR/bin" --quiet --timeout 150 > "$work/b.out" 2>&1 &
launcher=$!
wait_steps "$master" 60
victim=""
for _ in $(seq 1 100); do
  victim="$(grep -l "now aggregates the gradients of host 127.0.0.2" "$work"/run-b/logs/worker-*.log 2>/dev/null |
    sed 's/.*worker-\([0-9]*\)\.log/\1/' | head -n 1)"
  [[ -n $victim ]] && break
  sleep 0.1
done
[[ -n $victim ]] || fail "no worker aggregates host 127.0.0.2"
read -r _ pid < "$work/run-b/pids/worker-$victim"
kill -KILL "$pid"
set +e; wait "$launcher"; rc=$?; set -e
(( rc == 0 )) || { tail -n 30 "$work/b.out"; for f in "$work"/run-b/logs/worker-*.log; do echo "== $f"; grep -E "aggregat|dense allreduce|ERROR|WARN" "$f" | tail -n 12; done; fail "the job failed after the kill (exit $rc)"; }
grep -q "worker-$victim failed (code 137); restarting" "$work/b.out" || fail "worker $victim was not restarted"
# The other worker of that host took over its sum and its seat in the ring.
took="$(grep -l "now aggregates the gradients of host 127.0.0.2" "$work"/run-b/logs/worker-*.log |
  sed 's/.*worker-\([0-9]*\)\.log/\1/' | grep -v "^$victim\$" | head -n 1)"
[[ -n $took ]] || fail "no other worker took over host 127.0.0.2's aggregation"
grep -q "dense allreduce: ring of view [0-9]*: nodes [0-9]*, [0-9]*, this one" "$work/run-b/logs/worker-$took.log" ||
  fail "worker $took took over the aggregation but formed no ring of 2"
[[ "$(json_field "$work/run-b/summary.json" tasks_done)" == "$(json_field "$work/run-b/summary.json" tasks_total)" ]] ||
  fail "data tasks lost: $(cat "$work/run-b/summary.json")"
acc_b="$(json_field "$work/run-b/summary.json" final_test_accuracy)"
awk -v a="$acc_b" 'BEGIN { exit !(a >= 0.72) }' || fail "accuracy $acc_b after the kill"
echo "ok: host 127.0.0.2's aggregating worker $victim killed, worker $took took over: accuracy $acc_b"

# 3. The CTR workload: its dense layers through the hierarchical ring, its
#    sparse rows merged per key on each host and pushed by the host's
#    aggregating worker to 2 pservers; checkpoints every 100 steps hold
#    the 16 sparse partitions and the 2 ring members' shards. The hosts
#    have 3 workers and 1, and the job 5 data tasks: the last is trained
#    by one host while every worker of the other has finished, whose
#    version keeps up with the job's meanwhile (the ring's updates, the
#    pservers' version), so that its workers evaluate at the job's last
#    step without waiting.
write_ctr_config "$work/c.yaml" e2e-hier-ctr bsp "$(pick_port_base)" "$work/data"
# (Batches of 64: the 4 workers step 256 rows at a time.)
sed -i "s/^  type: wide_deep\$/  type: wide_deep\n  dense_sync: allreduce/; s/^  batch_size: 256\$/  batch_size: 64/; s/^cluster:\$/cluster:\n  aggregation: node/; s/^  task_records: 20000\$/  task_records: 45000/" "$work/c.yaml"
printf 'checkpoint:\n  dir: %s\n  every_steps: 100\n  every_seconds: 0\n  keep_last: 2\n' "$work/ckpt" >> "$work/c.yaml"
grep -q '^  dense_sync: allreduce$' "$work/c.yaml" && grep -q '^  aggregation: node$' "$work/c.yaml" &&
  grep -q '^  batch_size: 64$' "$work/c.yaml" && grep -q '^  task_records: 45000$' "$work/c.yaml" ||
  fail "config: $(cat "$work/c.yaml")"
printf '127.0.0.1 master pserver=2 worker=3\n127.0.0.2 worker=1\n' > "$work/hosts-ctr"
"$ROOT/scripts/launch.sh" run --config "$work/c.yaml" --hosts "$work/hosts-ctr" --run-dir "$work/run-c" \
  --bin-dir "$BUILD_DIR/bin" --quiet --timeout 240 > "$work/c.out" 2>&1 ||
  { tail -n 30 "$work/c.out"; for f in "$work"/run-c/logs/*.log; do echo "== $f"; tail -n 15 "$f"; done; fail "the hierarchical CTR run failed"; }
s="$work/run-c/summary.json"
[[ "$(json_field "$s" state)" == succeeded ]] || fail "state: $(cat "$s")"
auc="$(json_field "$s" final_test_auc)"
planted="$(json_field "$s" planted_test_auc)"
python3 -c "import sys; sys.exit(0 if 0.6 < $auc and $planted - $auc < 0.05 else 1)" ||
  fail "test AUC $auc is not within 0.05 of the planted model's $planted"
[[ "$(json_field "$s" tasks_total)" == 5 ]] || fail "CTR: not 5 data tasks: $(cat "$s")"
! grep -h "not those after the job's last step" "$work"/run-c/logs/worker-*.log ||
  fail "CTR: a host's version fell behind the job's while its workers had finished"
# (A host's aggregating worker is its lowest: when it runs out of data
# tasks it stays the host's member of the ring, and pushes the host's
# sparse rows still.)
mapfile -t lead < <(leaders "$work/run-c")
steady_leaders "$work/run-c" "${lead[@]}"
hosts_led="$(grep -ho "now aggregates the gradients of host 127.0.0.[12]" "$work"/run-c/logs/worker-*.log | sort -u | wc -l)"
(( hosts_led == 2 )) || fail "CTR: the aggregating workers (${lead[*]:-none}) do not stand for both hosts"
for w in "${lead[@]}"; do
  grep -q "dense allreduce: ring of view [0-9]*: nodes [0-9]*, [0-9]*, this one" "$work/run-c/logs/worker-$w.log" ||
    fail "CTR: aggregating worker $w formed no ring of 2"
done
last="$(ls -d "$work/ckpt"/ckpt-* | sort | tail -n 1)"
"$STRATA" checkpoint verify --dir "$last" | tee "$work/verify.out" | grep -q "16 partitions, 2 ring shards," ||
  fail "the last checkpoint is not of 16 partitions and 2 ring shards: $(cat "$work/verify.out")"
assert_nothing_left "$work"
echo "PASS: hierarchical allreduce: MLP accuracy $acc_a, $acc_b with an aggregating worker killed; CTR AUC $auc (planted $planted), checkpoint of 16 partitions and 2 ring shards"

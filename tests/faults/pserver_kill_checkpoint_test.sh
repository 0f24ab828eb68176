#!/usr/bin/env bash
# SIGKILL of a pserver with replication 0: its partitions are restored from
# the last checkpoint on the surviving pservers, the job goes on, reports
# exactly how many steps of those partitions were lost, and finishes within
# 1% of the fault-free run's accuracy.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
fault_config 0 6 "checkpoint:
  dir: $WORK/ckpt
  every_steps: 150
  every_seconds: 0
  on_finish: false"
run_job base || fail "the fault-free run failed: $(why base)"
rm -rf "$WORK/ckpt"

start_job kill
# After the first checkpoint, and well into the job.
for _ in $(seq 1 600); do
  compgen -G "$WORK/ckpt/ckpt-*/MANIFEST" > /dev/null && break
  sleep 0.05
done
compgen -G "$WORK/ckpt/ckpt-*/MANIFEST" > /dev/null || fail "no checkpoint was written"
wait_for_samples kill 100000
t0="$(now)"
kill -KILL "$(pid_of kill pserver-1)"
wait_job || fail "the job failed after the kill: $(why kill)"

restored="$(summary_field kill partitions_restored)"
lost="$(summary_field kill steps_lost)"
(( restored >= 1 )) || fail "no partition restored from the checkpoint: $(cat "$(summary kill)")"
(( lost >= 1 )) || fail "steps lost not reported (partitions restored: $restored)"
grep -q "restored from checkpoint" "$(summary kill)" || fail "no restore event in the summary"
# What the summary says matches what the pservers logged per partition.
logged="$(grep -ho 'moved on to version [0-9]*: [0-9]* step(s) of it lost' "$WORK"/run-kill/logs/pserver-*.log |
          sed 's/.*: \([0-9]*\) step.*/\1/' | paste -sd+ | bc)"
[[ "$logged" == "$lost" ]] || fail "summary says $lost steps lost, the pservers logged ${logged:-none}"
assert_accuracy_close kill base
echo "$restored partition(s) restored from a checkpoint, $lost partition-step(s) of updates lost"
throughput kill "$t0"
assert_nothing_left "$WORK"

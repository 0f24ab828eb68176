#!/usr/bin/env bash
# Stop and resume through scripts/launch.sh with real daemons: a bsp job
# checkpointed on request (`strata checkpoint`) and on a preemption notice
# (SIGTERM to a worker: checkpoint, then a clean stop), resumed with
# `--resume latest`, ends with exactly the model of the same job never
# stopped (equal checkpoint state digests: parameters and optimizer state
# bit for bit). Then a corrupt newest checkpoint is refused, naming its file,
# and the previous one is used; a checkpoint of another job is refused; and
# a Wide & Deep job on sparse tables, stopped at an incremental checkpoint,
# resumes to the same model too. Last, a job whose dense tables are kept by
# allreduce among the workers: its ring shards checkpointed, stopped and
# resumed to the same model; and a ring of 2 resumed from its 2 shards.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
work="$(mktemp -d /tmp/strata-e2e-ckpt-XXXXXX)"
trap 'pkill -KILL -f -- "$work" 2>/dev/null || true; [[ -n "${KEEP:-}" ]] || rm -rf "$work"' EXIT
# One worker: a bsp step is then one batch, and the run is deterministic.
printf '127.0.0.1 master pserver=2 worker=1\n' > "$work/hosts"

# ckpt_config FILE CHECKPOINT_DIR PORT_BASE
ckpt_config() {
  write_config "$1" bsp 8 "$3" 24000
  cat >> "$1" <<YAML
checkpoint:
  dir: $2
  every_steps: 0
  every_seconds: 0
  keep_last: 3
  grace_seconds: 30
YAML
}
launch() { "$ROOT/scripts/launch.sh" run --hosts "$work/hosts" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 300 "$@"; }
# The state digest of the newest checkpoint under a root.
final_digest() {
  local last; last="$(ls -d "$1"/ckpt-* | sort | tail -n 1)"
  "$STRATA" checkpoint verify --dir "$last" --json | sed -n 's/.*"state_digest": "\([0-9a-f]*\)".*/\1/p'
}

# 1. The job never stopped: its final checkpoint is the reference.
ckpt_config "$work/a.yaml" "$work/ck-a" "$(pick_port_base)"
launch --config "$work/a.yaml" --run-dir "$work/a" || fail "uninterrupted run failed"
[[ "$(json_field "$work/a/summary.json" checkpoints)" == 1 ]] || fail "expected the final checkpoint only"
want="$(final_digest "$work/ck-a")"
[[ -n "$want" ]] || fail "no digest of the reference checkpoint"
echo "ok: uninterrupted run, final state digest $want"

# 2. The same job, checkpointed on request, then preempted by SIGTERM to its
#    worker: checkpoint 2 and a clean stop (launch.sh exits 3).
base="$(pick_port_base)"
ckpt_config "$work/b.yaml" "$work/ck-b" "$base"
launch --config "$work/b.yaml" --run-dir "$work/b" > "$work/b.out" 2>&1 &
launcher=$!
wait_steps "127.0.0.1:$base" 60
"$STRATA" checkpoint --master "127.0.0.1:$base" > "$work/ck1.out" || { cat "$work/ck1.out"; fail "strata checkpoint failed"; }
grep -q "checkpoint 1 (full) at step" "$work/ck1.out" || { cat "$work/ck1.out"; fail "unexpected strata checkpoint output"; }
wait_steps "127.0.0.1:$base" 150
read -r _ wpid < "$work/b/pids/worker-0"
kill -TERM "$wpid"
expect_stopped "$work/b.out" "preempted run"
[[ "$(json_field "$work/b/summary.json" state)" == stopped ]] || fail "preempted job not 'stopped'"
[[ "$(json_field "$work/b/summary.json" checkpoints)" == 2 ]] || fail "expected 2 checkpoints before the stop"
grep -q "sigterm on worker 0" "$work/b/logs/master-0.log" || fail "the preemption checkpoint is not logged"
assert_nothing_left "$work/b"
"$STRATA" checkpoint list --dir "$work/ck-b"
echo "ok: checkpoint on request, then SIGTERM: checkpointed and stopped"

# 3. Resumed: the final model is the uninterrupted run's, bit for bit.
launch --config "$work/b.yaml" --run-dir "$work/b2" --resume latest || fail "resumed run failed"
[[ "$(json_field "$work/b2/summary.json" resumed_from)" == 2 ]] || fail "did not resume from checkpoint 2"
got="$(final_digest "$work/ck-b")"
[[ "$got" == "$want" ]] || fail "resumed final state $got differs from the uninterrupted run's $want"
acc_a="$(json_field "$work/a/summary.json" final_test_accuracy)"
acc_b="$(json_field "$work/b2/summary.json" final_test_accuracy)"
[[ "$acc_a" == "$acc_b" ]] || fail "test accuracy $acc_b after resuming, $acc_a uninterrupted"
echo "ok: resumed from checkpoint 2; final state and test accuracy ($acc_b) match"

# 4. The newest checkpoint corrupted: refused, naming the file; the one
#    before it is used, and the job again ends with the same model.
newest="$(ls -d "$work/ck-b"/ckpt-* | sort | tail -n 1)"
victim="$(ls "$newest"/p*.blk | head -n 1)"
# (Byte 100 inverted: written as 0xff it would change nothing were it 0xff
# already, as ceph_faults_test found.)
python3 - "$victim" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(100)
    b = f.read(1)[0]
    f.seek(100)
    f.write(bytes([b ^ 0xFF]))
PY
launch --config "$work/b.yaml" --run-dir "$work/b3" --resume latest || fail "run after corruption failed"
grep -q "checkpoint refused: $victim" "$work/b3/logs/master-0.log" ||
  { grep -i checkpoint "$work/b3/logs/master-0.log"; fail "the corrupt file is not named"; }
[[ "$(json_field "$work/b3/summary.json" resumed_from)" == 2 ]] || fail "did not fall back to checkpoint 2"
got="$(final_digest "$work/ck-b")"
[[ "$got" == "$want" ]] || fail "final state $got after the fallback differs from $want"
echo "ok: corrupt checkpoint refused, fell back to checkpoint 2"

# 5. A named checkpoint of another job is refused with the reason.
sed 's/name: e2e-bsp/name: another-job/' "$work/b.yaml" > "$work/other.yaml"
set +e
launch --config "$work/other.yaml" --run-dir "$work/other" --resume "$work/ck-b/ckpt-00000002" > "$work/other.out" 2>&1
rc=$?
set -e
(( rc != 0 )) || fail "a foreign job's checkpoint was accepted"
grep -q "a checkpoint of job 'e2e-bsp', not of this job 'another-job'" "$work/other/logs/master-0.log" ||
  { cat "$work/other.out"; fail "the foreign checkpoint's refusal does not say why"; }
assert_nothing_left "$work"
echo "ok: another job's checkpoint refused"

# 6. Sparse tables: a bsp Wide & Deep job (admission after 2 pushes, so the
#    admission counts are state too) with incremental checkpoints, stopped
#    and resumed, ends with the uninterrupted run's model.
ctr_config() {  # ctr_config FILE CHECKPOINT_DIR PORT_BASE
  CTR_SPARSE_EXTRA='  admission:
    min_count: 2' ctr_job_yaml e2e-ctr-resume 2 "$work/ctr-data" 60000 "$3" "$2" > "$1"
}
ctr_config "$work/ca.yaml" "$work/ck-ca" "$(pick_port_base)"
launch --config "$work/ca.yaml" --run-dir "$work/ca" || fail "uninterrupted CTR run failed"
want="$(final_digest "$work/ck-ca")"
base="$(pick_port_base)"
ctr_config "$work/cb.yaml" "$work/ck-cb" "$base"
launch --config "$work/cb.yaml" --run-dir "$work/cb" > "$work/cb.out" 2>&1 &
launcher=$!
wait_steps "127.0.0.1:$base" 300
checkpoint_stop "127.0.0.1:$base" "$work/cstop.out" "$work/cb.out" "stopped CTR run"
grep -q "(incremental)" "$work/cstop.out" || { cat "$work/cstop.out"; fail "the stop checkpoint is not incremental"; }
"$STRATA" checkpoint list --dir "$work/ck-cb" | grep -qE ' incremental .* steps$' ||
  fail "no incremental checkpoint taken every 40 steps"
launch --config "$work/cb.yaml" --run-dir "$work/cb2" --resume latest || fail "resumed CTR run failed"
got="$(final_digest "$work/ck-cb")"
[[ "$got" == "$want" ]] || fail "resumed CTR final state $got differs from the uninterrupted run's $want"
auc_a="$(json_field "$work/ca/summary.json" final_test_auc)"
auc_b="$(json_field "$work/cb2/summary.json" final_test_auc)"
[[ "$auc_a" == "$auc_b" ]] || fail "test AUC $auc_b after resuming, $auc_a uninterrupted"
assert_nothing_left "$work"
echo "ok: sparse tables: stopped at an incremental checkpoint, resumed, same model (AUC $auc_b)"

# 7. Dense tables by allreduce among the workers (model.dense_sync:
#    allreduce; docs/checkpoint-format.md "Allreduce tables"): each ring
#    member writes its shard of the tables and of the optimizer state.
#    One worker (a deterministic run): checkpointed on request, stopped at a
#    second checkpoint, resumed, it ends with the model of the run never
#    stopped, bit for bit.
ar_config() {  # ar_config FILE CHECKPOINT_DIR PORT_BASE
  ckpt_config "$1" "$2" "$3"
  # (All of Fashion-MNIST: a job of a few seconds, which the checkpoints
  # must catch while it trains.)
  sed -i 's/^  activation: relu$/  activation: relu\n  dense_sync: allreduce/; s/^  train_limit: 24000$/  train_limit: 60000/' "$1"
  grep -q '^  dense_sync: allreduce$' "$1" || fail "no model section to change"
}
ar_config "$work/ra.yaml" "$work/ck-ra" "$(pick_port_base)"
launch --config "$work/ra.yaml" --run-dir "$work/ra" || fail "uninterrupted allreduce run failed"
grep -q "placed 0 partition(s)" "$work/ra/logs/master-0.log" || fail "the allreduce tables went to the pservers"
"$STRATA" checkpoint verify --dir "$(ls -d "$work/ck-ra"/ckpt-* | sort | tail -n 1)" | grep -q ", 1 ring shards," ||
  fail "the final checkpoint has no ring shard"
want="$(final_digest "$work/ck-ra")"
base="$(pick_port_base)"
ar_config "$work/rb.yaml" "$work/ck-rb" "$base"
launch --config "$work/rb.yaml" --run-dir "$work/rb" > "$work/rb.out" 2>&1 &
launcher=$!
wait_steps "127.0.0.1:$base" 100
"$STRATA" checkpoint --master "127.0.0.1:$base" > "$work/rck1.out" || { cat "$work/rck1.out"; fail "strata checkpoint failed (allreduce)"; }
wait_steps "127.0.0.1:$base" 250
checkpoint_stop "127.0.0.1:$base" "$work/rstop.out" "$work/rb.out" "stopped allreduce run" "$work/rb"
launch --config "$work/rb.yaml" --run-dir "$work/rb2" --resume latest || fail "resumed allreduce run failed"
[[ "$(json_field "$work/rb2/summary.json" resumed_from)" == 2 ]] || fail "the allreduce job did not resume from checkpoint 2"
grep -q "allreduce tables from checkpoint 2" "$work/rb2/logs/worker-0.log" ||
  fail "the worker did not restore the ring's tables: $(grep -i 'allreduce\|checkpoint' "$work/rb2/logs/worker-0.log" | head)"
got="$(final_digest "$work/ck-rb")"
[[ "$got" == "$want" ]] || fail "resumed allreduce final state $got differs from the uninterrupted run's $want"
acc_a="$(json_field "$work/ra/summary.json" final_test_accuracy)"
acc_b="$(json_field "$work/rb2/summary.json" final_test_accuracy)"
[[ "$acc_a" == "$acc_b" ]] || fail "allreduce test accuracy $acc_b after resuming, $acc_a uninterrupted"
echo "ok: allreduce tables: stopped, resumed, same model (accuracy $acc_b)"

# A ring of 2: the shards of both, restored by both (the ring's first
#    Form brings the checkpoint's state in); the job trains on to its
#    accuracy.
printf '127.0.0.1 master pserver=1 worker=2\n' > "$work/hosts"
base="$(pick_port_base)"
ar_config "$work/rc.yaml" "$work/ck-rc" "$base"
launch --config "$work/rc.yaml" --run-dir "$work/rc" > "$work/rc.out" 2>&1 &
launcher=$!
wait_steps "127.0.0.1:$base" 150
checkpoint_stop "127.0.0.1:$base" "$work/rcstop.out" "$work/rc.out" "stopped ring of 2"
"$STRATA" checkpoint verify --dir "$work/ck-rc/ckpt-00000001" | grep -q ", 2 ring shards," ||
  fail "the checkpoint of a ring of 2 has not 2 shards: $("$STRATA" checkpoint verify --dir "$work/ck-rc/ckpt-00000001")"
launch --config "$work/rc.yaml" --run-dir "$work/rc2" --resume latest || fail "resumed ring of 2 failed"
for w in 0 1; do
  grep -q "allreduce tables from checkpoint 1" "$work/rc2/logs/worker-$w.log" ||
    fail "worker $w did not restore the ring's tables"
done
grep -q "the optimizer state is the checkpoint's" "$work/rc2/logs/worker-0.log" "$work/rc2/logs/worker-1.log" ||
  fail "the first ring did not take the checkpoint's state"
acc="$(json_field "$work/rc2/summary.json" final_test_accuracy)"
(( $(python3 -c "print(int($acc * 1000))") >= 780 )) || fail "the resumed ring of 2 reached $acc test accuracy (< 0.78)"
assert_nothing_left "$work"
echo "ok: a ring of 2 stopped and resumed from its 2 shards (accuracy $acc)"

#!/usr/bin/env bash
# Training on a real Ceph: Fashion-MNIST read from a CephFS mount
# (ceph-fuse), checkpoints written to radosgw over S3. A bsp job stopped at
# a checkpoint and resumed from the bucket ends with exactly the model of
# the same job never stopped (equal state digests, read back from the
# bucket). Then a Wide & Deep job on sparse tables, its data generated into
# CephFS, writes incremental checkpoints to the bucket and resumes from
# them to the uninterrupted run's model. s3cmd, a separate client, checks
# what is in the bucket.
BUILD_DIR="$1"
source "$(dirname "$0")/ceph_lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
work="$(mktemp -d /tmp/strata-ceph-train-XXXXXX)"
trap 'pkill -KILL -f -- "$work" 2>/dev/null || true; [[ -n "${KEEP:-}" ]] || rm -rf "$work"' EXIT
printf '127.0.0.1 master pserver=2 worker=1\n' > "$work/hosts"
bucket="strata-e2e-$$"
s3 mb "s3://$bucket" > /dev/null || fail "s3cmd mb s3://$bucket failed"
data="$(fmnist_on_cephfs)"
echo "ok: Fashion-MNIST on CephFS at $data ($(du -sh "$data" | cut -f1))"

# A run that fails prints the tails of its logs (on stderr), which go with
# the work directory. (Once in a few suite runs a job here did not finish
# within 400 s, and nothing was left to say why.)
launch() {
  "$ROOT/scripts/launch.sh" run --hosts "$work/hosts" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 400 "$@" && return 0
  local rc=$? dir="" prev="" f
  for f in "$@"; do [[ $prev == --run-dir ]] && dir=$f; prev=$f; done
  [[ -z $dir ]] || log_tails "$dir" 40 >&2
  return $rc
}

# fmnist_config FILE ROOT PORT_BASE: bsp, 4 epochs of 12000 images (750
# steps: the stop at step 250 is far from the end however fast the
# machine), data on CephFS, a checkpoint every 100 steps into ROOT.
fmnist_config() {
  write_config "$1" bsp 4 "$3" 12000
  sed -i "s#$FMNIST#$data#" "$1"
  cat >> "$1" <<YAML
checkpoint:
  dir: $2
  every_steps: 100
  every_seconds: 0
  keep_last: 2
$(s3_yaml)
YAML
}

# 1. Uninterrupted: the reference model, its checkpoints in the bucket.
fmnist_config "$work/a.yaml" "s3://$bucket/fmnist-a" "$(pick_port_base)"
launch --config "$work/a.yaml" --run-dir "$work/a" || fail "uninterrupted run on Ceph failed"
grep -q "object store $S3_ENDPOINT" "$work/a/logs/master-0.log" || fail "the master did not use the object store"
seq_a="$(latest_seq "s3://$bucket/fmnist-a" "$work/a.yaml")"
[[ -n "$seq_a" ]] || fail "no complete checkpoint in s3://$bucket/fmnist-a"
want="$(digest_of "s3://$bucket/fmnist-a" "$seq_a" "$work/a.yaml")"
[[ -n "$want" ]] || fail "no digest of checkpoint $seq_a in the bucket"
# keep_last 2: retention deleted the older ones, in the bucket.
kept="$(s3 ls "s3://$bucket/fmnist-a/" | grep -c 'ckpt-' || true)"
(( kept == 2 )) || { s3 ls "s3://$bucket/fmnist-a/"; fail "expected 2 checkpoints kept in the bucket, found $kept"; }
s3 ls "s3://$bucket/fmnist-a/$(printf 'ckpt-%08d' "$seq_a")/" > "$work/ls-a"
grep -q MANIFEST "$work/ls-a" || { cat "$work/ls-a"; fail "s3cmd sees no MANIFEST of checkpoint $seq_a"; }
acc_a="$(json_field "$work/a/summary.json" final_test_accuracy)"
echo "ok: uninterrupted run, data from CephFS, checkpoint $seq_a in radosgw (accuracy $acc_a, digest $want)"

# 2. The same job stopped at a checkpoint of its own, then resumed from the
#    bucket: the same final model.
base="$(pick_port_base)"
fmnist_config "$work/b.yaml" "s3://$bucket/fmnist-b" "$base"
launch --config "$work/b.yaml" --run-dir "$work/b" > "$work/b.out" 2>&1 &
launcher=$!
wait_steps "127.0.0.1:$base" 250
checkpoint_stop "127.0.0.1:$base" "$work/stop.out" "$work/b.out" "stopped run"
assert_nothing_left "$work/b"
"$STRATA" checkpoint list --dir "s3://$bucket/fmnist-b" --config "$work/b.yaml"
launch --config "$work/b.yaml" --run-dir "$work/b2" --resume latest || fail "resumed run on Ceph failed"
from="$(json_field "$work/b2/summary.json" resumed_from)"
[[ -n "$from" && "$from" != 0 ]] || fail "the resumed run did not resume from the bucket"
got="$(digest_of "s3://$bucket/fmnist-b" "$(latest_seq "s3://$bucket/fmnist-b" "$work/b.yaml")" "$work/b.yaml")"
[[ "$got" == "$want" ]] || fail "resumed final state $got differs from the uninterrupted run's $want"
acc_b="$(json_field "$work/b2/summary.json" final_test_accuracy)"
[[ "$acc_a" == "$acc_b" ]] || fail "test accuracy $acc_b after resuming, $acc_a uninterrupted"
echo "ok: stopped, resumed from checkpoint $from in radosgw: same final model (accuracy $acc_b)"

# 3. The data set itself in the bucket: the master sizes it with ranged GETs
#    of the files' headers and tails, the workers read it over S3.
s3 put "$data"/*-ubyte.gz "s3://$bucket/fashion-mnist/" > /dev/null
write_config "$work/s.yaml" bsp 1 "$(pick_port_base)" 6000
sed -i "s#$FMNIST#s3://$bucket/fashion-mnist#" "$work/s.yaml"
s3_yaml >> "$work/s.yaml"
grep -q "train_images: s3://$bucket/fashion-mnist/train-images-idx3-ubyte.gz" "$work/s.yaml" ||
  fail "the config does not name the bucket's data"
launch --config "$work/s.yaml" --run-dir "$work/s" || fail "a run with its data in radosgw failed"
acc_s="$(json_field "$work/s/summary.json" final_test_accuracy)"
awk -v a="$acc_s" 'BEGIN { exit !(a > 0.6) }' || fail "accuracy $acc_s with the data read from radosgw"
grep -q "6000 training records" "$work/s/logs/master-0.log" || fail "the master did not size the data set in the bucket"
echo "ok: Fashion-MNIST read from radosgw (sized by ranged GETs on the master): accuracy $acc_s"

# 4. Sparse tables: CTR data generated into CephFS, incremental checkpoints
#    in the bucket, stopped and resumed: the same model. The stopped and
#    resumed runs read the training file from the bucket, each data task
#    its own byte range (ranged GETs): the same records, the same model.
ctr_config() {  # ctr_config FILE ROOT PORT_BASE [TRAIN]
  { ctr_job_yaml ceph-ctr 4 "$CEPHFS/ctr" 40000 "$3" "$2" ${4:+"$4"}; s3_yaml; } > "$1"
}
ctr_config "$work/ca.yaml" "s3://$bucket/ctr-a" "$(pick_port_base)"
launch --config "$work/ca.yaml" --run-dir "$work/ca" || fail "uninterrupted CTR run on Ceph failed"
want="$(digest_of "s3://$bucket/ctr-a" "$(latest_seq "s3://$bucket/ctr-a" "$work/ca.yaml")" "$work/ca.yaml")"
s3 put "$CEPHFS/ctr/train.txt" "s3://$bucket/ctr-data/train.txt" > /dev/null ||
  fail "cannot copy the CTR training file into the bucket"
base="$(pick_port_base)"
ctr_config "$work/cb.yaml" "s3://$bucket/ctr-b" "$base" "s3://$bucket/ctr-data/train.txt"
launch --config "$work/cb.yaml" --run-dir "$work/cb" > "$work/cb.out" 2>&1 &
launcher=$!
wait_steps "127.0.0.1:$base" 250
checkpoint_stop "127.0.0.1:$base" "$work/cstop.out" "$work/cb.out" "stopped CTR run"
grep -q "(incremental)" "$work/cstop.out" || { cat "$work/cstop.out"; fail "the stop checkpoint is not incremental"; }
"$STRATA" checkpoint list --dir "s3://$bucket/ctr-b" --config "$work/cb.yaml" | tee "$work/ctr-list"
grep -qE ' incremental ' "$work/ctr-list" || fail "no incremental checkpoint in the bucket"
launch --config "$work/cb.yaml" --run-dir "$work/cb2" --resume latest || fail "resumed CTR run on Ceph failed"
cat "$work"/cb2/logs/worker*.log > "$work/cb2-workers.log"
grep -q "training records read per data task from s3://$bucket/ctr-data/train.txt" \
  "$work/cb2-workers.log" || fail "the workers did not read the bucket's training file by task"
got="$(digest_of "s3://$bucket/ctr-b" "$(latest_seq "s3://$bucket/ctr-b" "$work/cb.yaml")" "$work/cb.yaml")"
[[ "$got" == "$want" ]] || fail "resumed CTR final state $got differs from the uninterrupted run's $want"
assert_nothing_left "$work"
s3 rb --recursive "s3://$bucket" > /dev/null 2>&1 || true
echo "ok: sparse tables: incremental checkpoints in radosgw, resumed, same model"

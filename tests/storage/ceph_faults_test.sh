#!/usr/bin/env bash
# Faults against the real object store (the Ceph of tests/storage/ceph):
#  1. radosgw dies in the middle of a checkpoint (frozen with SIGSTOP while
#     the checkpoint writes, then SIGKILLed): that checkpoint fails cleanly,
#     training goes on, the previous checkpoint stays the latest; with
#     radosgw back the next checkpoint succeeds and the job ends well.
#  2. a partition file corrupted in the bucket: the resumed job refuses that
#     checkpoint by its checksum, naming the object, and uses the one before.
#  3. wrong keys: the cluster does not start, and the master says why at
#     once, not at the first checkpoint.
BUILD_DIR="$1"
source "$(dirname "$0")/ceph_lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
work="$(mktemp -d /tmp/strata-ceph-faults-XXXXXX)"
rgw_back() { "$CEPH_SH" rgw-start "$CEPH_DIR" > /dev/null 2>&1 || true; }
trap 'kill -CONT "$(cat "$CEPH_DIR/rgwpid" 2>/dev/null)" 2>/dev/null || true
      curl -s -o /dev/null "$S3_ENDPOINT" || rgw_back
      pkill -KILL -f -- "$work" 2>/dev/null || true; [[ -n "${KEEP:-}" ]] || rm -rf "$work"' EXIT
printf '127.0.0.1 master pserver=2 worker=1\n' > "$work/hosts"
bucket="strata-faults-$$"
s3 mb "s3://$bucket" > /dev/null || fail "s3cmd mb s3://$bucket failed"
data="$(fmnist_on_cephfs)"
base="$(pick_port_base)"
master="127.0.0.1:$base"
root="s3://$bucket/job"
# Far more epochs than the test lets it run: every stop is by `strata
# checkpoint --stop`, so no phase can find the job already over.
write_config "$work/job.yaml" bsp 40 "$base"
sed -i "s#$FMNIST#$data#" "$work/job.yaml"
cat >> "$work/job.yaml" <<YAML
checkpoint:
  dir: $root
  every_steps: 0
  every_seconds: 0
  keep_last: 3
  timeout_seconds: 30
$(s3_yaml)
YAML

"$ROOT/scripts/launch.sh" run --hosts "$work/hosts" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 400 \
  --config "$work/job.yaml" --run-dir "$work/run" > "$work/run.out" 2>&1 &
launcher=$!
wait_steps "$master" 50
"$STRATA" checkpoint --master "$master" > "$work/ck1.out" 2>&1 || { cat "$work/ck1.out"; fail "checkpoint 1 failed"; }
echo "ok: checkpoint 1 written to radosgw"

# 1. radosgw frozen, a checkpoint started against it, radosgw killed.
rgw="$(cat "$CEPH_DIR/rgwpid")"
kill -STOP "$rgw"
"$STRATA" checkpoint --master "$master" --timeout 120 > "$work/ck2.out" 2>&1 &
ckpt=$!
# The checkpoint is under way, its requests waiting on the frozen radosgw.
sleep 1.5
kill -KILL "$rgw"
set +e; wait "$ckpt"; ck_rc=$?; set -e
(( ck_rc != 0 )) || { cat "$work/ck2.out"; fail "the checkpoint against a dead radosgw reported success"; }
grep -q "checkpoint 2 (request) failed" "$work/run/logs/master-0.log" ||
  { grep -i checkpoint "$work/run/logs/master-0.log"; fail "the master did not log checkpoint 2's failure"; }
grep "checkpoint 2 (request) failed" "$work/run/logs/master-0.log" | head -n 1 | cut -c1-300
before="$(steps_of "$master")"
sleep 2
after="$(steps_of "$master")"
[[ -n "$before" && -n "$after" && "$after" -gt "$before" ]] ||
  fail "training did not go on after the failed checkpoint (steps $before then $after)"
kill -0 "$launcher" 2>/dev/null || { tail -n 20 "$work/run.out"; fail "the job ended with radosgw"; }
echo "ok: radosgw killed mid-checkpoint: checkpoint 2 failed cleanly, training went on ($before -> $after steps)"

rgw_back
[[ "$(latest_seq "$root" "$work/job.yaml")" == 1 ]] ||
  { "$STRATA" checkpoint list --dir "$root" --config "$work/job.yaml"; fail "checkpoint 1 is not the latest after the failure"; }
"$STRATA" checkpoint --master "$master" > "$work/ck3.out" 2>&1 || { cat "$work/ck3.out"; fail "the checkpoint after radosgw came back failed"; }
grep -q "checkpoint 3" "$work/ck3.out" || { cat "$work/ck3.out"; fail "unexpected output of the third checkpoint"; }
echo "ok: radosgw back: $(head -n 1 "$work/ck3.out" | sed 's/^checkpointing... //')"

# Stopped at a checkpoint of its own (launch.sh exits 3).
checkpoint_stop "$master" "$work/ck4.out" "$work/run.out" "the job after the radosgw fault"
assert_nothing_left "$work/run"
"$STRATA" checkpoint list --dir "$root" --config "$work/job.yaml" | tee "$work/list"
final="$(latest_seq "$root" "$work/job.yaml")"
(( final == 4 )) || fail "expected checkpoint 4 as the latest, got $final"
echo "ok: stopped at checkpoint $final"

# 2. The newest checkpoint's first partition file corrupted in the bucket.
dir="$root/$(printf 'ckpt-%08d' "$final")"
victim="$(s3 ls "$dir/" | awk '{print $4}' | grep '\.blk$' | head -n 1)"
[[ -n "$victim" ]] || fail "no partition file in $dir"
s3 get "$victim" "$work/victim.blk" > /dev/null
# (Its middle byte inverted: writing 0xff there changed nothing when the
# byte was 0xff already, and the test failed once on that.)
python3 - "$work/victim.blk" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(0, 2)
    at = f.tell() // 2
    f.seek(at)
    b = f.read(1)[0]
    f.seek(at)
    f.write(bytes([b ^ 0xFF]))
PY
s3 put "$work/victim.blk" "$victim" > /dev/null
"$ROOT/scripts/launch.sh" run --hosts "$work/hosts" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 300 \
  --config "$work/job.yaml" --run-dir "$work/resume" --resume latest > "$work/resume.out" 2>&1 &
launcher=$!
wait_steps "$master" 20
grep -q "checkpoint refused: $victim" "$work/resume/logs/master-0.log" ||
  { grep -i checkpoint "$work/resume/logs/master-0.log" | head; fail "the corrupt object $victim is not named"; }
grep "checkpoint refused" "$work/resume/logs/master-0.log" | head -n 1 | cut -c1-300
checkpoint_stop "$master" "$work/ck5.out" "$work/resume.out" "the resumed job"
from="$(json_field "$work/resume/summary.json" resumed_from)"
(( from > 0 && from < final )) || fail "resumed from $from, not from a checkpoint before $final"
echo "ok: corrupt object refused by its checksum; resumed from checkpoint $from"

# 3. Wrong keys: refused at start, saying why.
creds_key="$(sed -n 's/^aws_access_key_id = //p' "$S3_CREDENTIALS")"
(umask 077; printf '[default]\naws_access_key_id = %s\naws_secret_access_key = wrong-secret\n' "$creds_key" > "$work/bad.credentials")
sed "s#credentials_file: .*#credentials_file: $work/bad.credentials#" "$work/job.yaml" > "$work/bad.yaml"
start=$SECONDS
set +e
"$ROOT/scripts/launch.sh" run --hosts "$work/hosts" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 60 \
  --config "$work/bad.yaml" --run-dir "$work/bad" > "$work/bad.out" 2>&1
rc=$?
set -e
(( rc != 0 )) || fail "a cluster with wrong keys started"
grep -q "cannot start master: checkpoint.dir $root: .*SignatureDoesNotMatch" "$work/bad/logs/master-0.log" ||
  { cat "$work/bad/logs/master-0.log" "$work/bad.out" | tail -n 20; fail "the master did not say the keys are wrong"; }
grep -q "wrong-secret" "$work"/bad/logs/*.log "$work/bad.out" && fail "the secret appears in a log"
assert_nothing_left "$work/bad"
echo "ok: wrong keys refused at start in $((SECONDS - start)) s: $(grep -o 'cannot start master.*' "$work/bad/logs/master-0.log" | head -n 1 | cut -c1-200)"
s3 rb --recursive "s3://$bucket" > /dev/null 2>&1 || true

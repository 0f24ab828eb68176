#!/usr/bin/env bash
# Progress of the long operations, shown as they happen:
#   bring-up: `strata wait --until running` (what launch.sh run shows) while
#     the daemons of a cluster (1 master, 2 pservers, 1 worker) are started
#     one at a time: pservers registering, then workers, then running;
#   a checkpoint: `strata checkpoint` while one pserver is held (SIGSTOP)
#     shows "1 of 2 pserver(s) written", and so does `strata status`;
#   a restore from that checkpoint, with a pserver held: "restoring
#     checkpoint 1: 0 of 2 pserver(s) loaded";
#   launch.sh run follows bring-up until the job runs.
BUILD_DIR="$1"
source "$(dirname "$0")/../e2e/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"

work="$(mktemp -d /tmp/strata-progress-XXXXXX)"
trap 'pkill -CONT -f -- "$work" 2>/dev/null || true; pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
base="$(pick_port_base)"
write_config "$work/job.yaml" asp 50 "$base"
cat >> "$work/job.yaml" <<YAML
checkpoint:
  dir: $work/ck
  every_steps: 0
  every_seconds: 0
  keep_last: 3
YAML
# A pserver is held (SIGSTOP) below for up to a second or two: far from
# being declared dead.
sed -i 's/^  dead_timeout_ms: 2000$/  dead_timeout_ms: 15000/' "$work/job.yaml"
grep -q '^  dead_timeout_ms: 15000$' "$work/job.yaml" || fail "cannot set the dead timeout"
printf '127.0.0.1 master pserver=2 worker\n' > "$work/hosts"
bin="$BUILD_DIR/bin"
master="127.0.0.1:$base"

# 1. Bring-up, one daemon at a time.
"$bin/strata-master" --config "$work/job.yaml" --hosts "$work/hosts" --host 127.0.0.1 \
  --port "$base" --http_port "$((base + 1))" --summary "$work/summary.json" \
  --state_dir "$work/master-state" > "$work/master.log" 2>&1 &
for _ in $(seq 1 100); do "$STRATA" status --master "$master" > /dev/null 2>&1 && break; sleep 0.1; done
"$STRATA" wait --master "$master" --until running --timeout 60 > "$work/wait.out" 2>&1 &
waiter=$!
# until LINE: the waiter has printed LINE (at most 10 s).
until_line() {
  for _ in $(seq 1 100); do grep -qF "$1" "$work/wait.out" && return 0; sleep 0.1; done
  cat "$work/wait.out"; fail "strata wait --until running never printed '$1'"
}
until_line "bring-up: waiting for pservers: 0 of 2 registered"
"$STRATA" status --master "$master" | grep -q '^  bring-up: waiting for pservers: 0 of 2 registered$' ||
  fail "strata status does not show where bring-up stands"
"$bin/strata-pserver" --config "$work/job.yaml" --master "$master" --index 0 --host 127.0.0.1 \
  > "$work/ps0.log" 2>&1 &
until_line "bring-up: waiting for pservers: 1 of 2 registered"
"$bin/strata-pserver" --config "$work/job.yaml" --master "$master" --index 1 --host 127.0.0.1 \
  > "$work/ps1.log" 2>&1 &
ps1=$!
until_line "bring-up: waiting for workers: 0 of 1 registered"
"$bin/strata-worker" --config "$work/job.yaml" --master "$master" --index 0 --host 127.0.0.1 \
  > "$work/w0.log" 2>&1 &
wait "$waiter" || { cat "$work/wait.out"; fail "strata wait --until running failed"; }
tail -n 1 "$work/wait.out" | grep -qx 'job e2e-asp is running' || { cat "$work/wait.out"; fail "the wait did not end with the job running"; }
cat "$work/wait.out"

# 2. A checkpoint with pserver 1 held: "1 of 2" written, then done.
wait_steps "$master" 100
kill -STOP "$ps1"
"$STRATA" checkpoint --master "$master" --timeout 60 > "$work/ck.out" 2>&1 &
ck=$!
seen=""
for _ in $(seq 1 100); do
  if "$STRATA" status --master "$master" | grep -qE '^  checkpoint 1 in progress: 1 of 2 pserver\(s\) written, [0-9.]+ MB'; then
    seen=1; break
  fi
  sleep 0.02
done
sleep 0.4  # (strata checkpoint looks every 0.3 s)
kill -CONT "$ps1"
wait "$ck" || { cat "$work/ck.out"; fail "strata checkpoint failed"; }
[[ -n $seen ]] || fail "strata status never showed the checkpoint 1 of 2 pservers written"
grep -qE '^  checkpoint 1: 1 of 2 pserver\(s\) written, [0-9.]+ MB, [0-9.]+ s$' "$work/ck.out" ||
  { cat "$work/ck.out"; fail "strata checkpoint showed no progress"; }
grep -q 'checkpoint 1 (full)' "$work/ck.out" || { cat "$work/ck.out"; fail "strata checkpoint did not finish"; }
cat "$work/ck.out"
"$STRATA" stop --master "$master" --no-checkpoint > /dev/null || fail "strata stop failed"
pkill -TERM -f -- "$work" 2>/dev/null || true
for _ in $(seq 1 100); do pgrep -f -- "$work" > /dev/null || break; sleep 0.1; done

# 3. A restore: the job again from checkpoint 1, with pserver 0 held
#    (SIGSTOP) so that the master waits on its partitions: "restoring
#    checkpoint 1: 0 of 2 pserver(s) loaded", then on.
"$bin/strata-master" --config "$work/job.yaml" --hosts "$work/hosts" --host 127.0.0.1 \
  --port "$base" --http_port "$((base + 1))" --summary "$work/summary2.json" \
  --state_dir "$work/master-state2" --resume latest > "$work/master2.log" 2>&1 &
for _ in $(seq 1 100); do "$STRATA" status --master "$master" > /dev/null 2>&1 && break; sleep 0.1; done
: > "$work/wait.out"
"$STRATA" wait --master "$master" --until running --timeout 60 > "$work/wait.out" 2>&1 &
waiter=$!
"$bin/strata-pserver" --config "$work/job.yaml" --master "$master" --index 0 --host 127.0.0.1 \
  > "$work/ps0b.log" 2>&1 &
ps0=$!
until_line "bring-up: waiting for pservers: 1 of 2 registered"
kill -STOP "$ps0"
"$bin/strata-pserver" --config "$work/job.yaml" --master "$master" --index 1 --host 127.0.0.1 \
  > "$work/ps1b.log" 2>&1 &
until_line "bring-up: restoring checkpoint 1: 0 of 2 pserver(s) loaded"
"$STRATA" status --master "$master" | grep -q '^  bring-up: restoring checkpoint 1: ' ||
  fail "strata status does not show the restore"
kill -CONT "$ps0"
"$bin/strata-worker" --config "$work/job.yaml" --master "$master" --index 0 --host 127.0.0.1 \
  > "$work/w0b.log" 2>&1 &
wait "$waiter" || { cat "$work/wait.out"; fail "strata wait --until running failed after the restore"; }
cat "$work/wait.out"
grep -q 'resum\|restor' "$work/master2.log" || fail "the master did not restore"
"$STRATA" stop --master "$master" --no-checkpoint > /dev/null || fail "strata stop failed (restored job)"
pkill -TERM -f -- "$work" 2>/dev/null || true
for _ in $(seq 1 100); do pgrep -f -- "$work" > /dev/null || break; sleep 0.1; done

# 4. launch.sh run follows bring-up until the job runs.
base="$(pick_port_base)"
write_config "$work/short.yaml" bsp 1 "$base" 4000
"$ROOT/scripts/launch.sh" run --config "$work/short.yaml" --hosts "$work/hosts" --run-dir "$work/run" \
  --bin-dir "$bin" --timeout 120 > "$work/run.out" 2>&1 || { cat "$work/run.out"; fail "launch.sh run failed"; }
# (Its bring-up lines depend on how far the daemons got when it first
# looks; part 1 checks them one by one.)
grep -qE '^launch.sh: job e2e-bsp (is running|is evaluating|succeeded)$' "$work/run.out" || { cat "$work/run.out"; fail "launch.sh run did not say the job runs"; }
assert_nothing_left "$work"
echo "PASS: bring-up, checkpoint and launch.sh run progress"

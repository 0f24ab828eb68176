#!/usr/bin/env bash
# A daemon SIGKILLed at each step of writing a checkpoint (failpoints:
# --failpoint on the daemon, common/failpoint.h), then the whole cluster
# lost: a restart with `--resume latest` picks the newest complete
# checkpoint: the one before when the crash came before its manifest, the
# new one when it came after; it is intact (`strata checkpoint verify`).
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
work="$(mktemp -d /tmp/strata-e2e-crash-XXXXXX)"
trap 'pkill -KILL -f -- "$work" 2>/dev/null || true; [[ -n "${KEEP:-}" ]] || rm -rf "$work"' EXIT
printf '127.0.0.1 master pserver=2 worker=1\n' > "$work/hosts"
base="$(pick_port_base)"
master="127.0.0.1:$base"
write_config "$work/job.yaml" bsp 50 "$base" 12000
cat >> "$work/job.yaml" <<YAML
checkpoint:
  dir: $work/ck
  every_seconds: 0
  on_finish: false
  keep_last: 2
  timeout_seconds: 20
YAML

up() {  # up RUN [--resume latest]: a cluster, training
  "$ROOT/scripts/launch.sh" up --config "$work/job.yaml" --hosts "$work/hosts" \
    --run-dir "$work/$1" --bin-dir "$BUILD_DIR/bin" "${@:2}" > "$work/$1.out" 2>&1 ||
    { cat "$work/$1.out"; fail "bring-up of $1 failed"; }
  for _ in $(seq 1 300); do
    "$STRATA" status --master "$master" --json 2>/dev/null > "$work/status.json" || true
    grep -q '"state": "running"' "$work/status.json" &&
      grep -qE '"stepsDone": "[1-9]' "$work/status.json" && return 0
    sleep 0.1
  done
  fail "$1 did not start training"
}
kill_all() {  # the whole cluster lost at once
  local f host pid
  for f in "$work/$1"/pids/*; do
    [[ -f "$f" ]] || continue
    read -r host pid < "$f"
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$f"
  done
  sleep 0.3
}
newest_complete() {
  local m; m="$(ls "$work"/ck/ckpt-*/MANIFEST 2>/dev/null | sort | tail -n 1)"
  [[ -n "$m" ]] && basename "$(dirname "$m")" | sed 's/ckpt-0*//'
}
resumed_from() {
  "$STRATA" status --master "$master" --json | sed -n 's/.*"resumedFromSeq": "\([0-9]*\)".*/\1/p'
}

up first
"$STRATA" checkpoint --master "$master" > /dev/null || fail "the first checkpoint failed"
kill_all first
[[ "$(newest_complete)" == 1 ]] || fail "checkpoint 1 is not complete"

i=0
for point in pserver.checkpoint.before_file pserver.checkpoint.after_file \
             pserver.checkpoint.after_file@3 pserver.checkpoint.before_reply \
             master.checkpoint.before_manifest master.checkpoint.after_manifest \
             master.checkpoint.after_retention; do
  i=$((i + 1))
  before="$(newest_complete)"
  role="${point%%.*}"
  if [[ $role == master ]]; then
    STRATA_MASTER_FLAGS="--failpoint=$point" up "run$i" --resume latest
  else
    STRATA_PSERVER_FLAGS="--failpoint=$point" up "run$i" --resume latest
  fi
  [[ "$(resumed_from)" == "$before" ]] || fail "$point: resumed from $(resumed_from), not $before"
  "$STRATA" checkpoint --master "$master" > "$work/ck$i.out" 2>&1 || true
  grep -q "failpoint $point" "$work/run$i"/logs/*.log 2>/dev/null ||
    grep -q "failpoint ${point%@*}" "$work/run$i"/logs/*.log || fail "$point: no daemon crashed there"
  kill_all "run$i"
  after="$(newest_complete)"
  case "$point" in
    master.checkpoint.after_*) (( after > before )) || fail "$point: the complete checkpoint was lost" ;;
    *) [[ "$after" == "$before" ]] || fail "$point: checkpoint $after complete after a crash before its manifest" ;;
  esac
  "$STRATA" checkpoint verify --dir "$work/ck/$(printf 'ckpt-%08d' "$after")" > /dev/null ||
    fail "$point: the newest complete checkpoint does not verify"
  echo "ok: crash at $point: newest complete checkpoint $after (was $before)"
done

# SIGTERM to a pserver, then to the master (a preemption notice): each time
# a checkpoint, then the job stops ('stopped'), with nothing SIGKILLed.
for role in pserver master; do
  before="$(newest_complete)"
  up "term-$role" --resume latest
  read -r _ pid < "$work/term-$role/pids/$role-0"
  kill -TERM "$pid"
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && fail "$role did not stop after SIGTERM"
  grep -q "sigterm on $role" "$work/term-$role/logs/master-0.log" ||
    fail "no checkpoint on SIGTERM to the $role"
  (( $(newest_complete) > before )) || fail "SIGTERM to the $role: no new complete checkpoint"
  grep -q '"state": "stopped"' "$work/term-$role/summary.json" || fail "SIGTERM to the $role: job not stopped"
  kill_all "term-$role"
  echo "ok: SIGTERM to the $role: checkpoint $(newest_complete), job stopped"
done

# Last: a clean restart resumes from the newest, and checkpoints again.
before="$(newest_complete)"
up last --resume latest
[[ "$(resumed_from)" == "$before" ]] || fail "the last restart resumed from $(resumed_from), not $before"
"$STRATA" checkpoint --master "$master" > /dev/null || fail "no checkpoint after the crashes"
kill_all last
(( $(newest_complete) > before )) || fail "the checkpoint after the crashes is not complete"
"$STRATA" checkpoint list --dir "$work/ck"
assert_nothing_left "$work"
echo "ok: resumed from $before after every crash; checkpoints work again"

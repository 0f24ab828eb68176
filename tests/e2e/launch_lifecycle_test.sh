#!/usr/bin/env bash
# launch.sh's life cycle: remote hosts through a pluggable remote command,
# an interrupted run, and a daemon that dies mid-job. In every case nothing
# may be left running afterwards.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
work="$(mktemp -d /tmp/strata-e2e-life-XXXXXX)"
trap 'pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
printf '127.0.0.1 master pserver=2 worker=2\n' > "$work/hosts"

# 1. Every host through the remote command (a stand-in for ssh that records
#    the host it was given and runs the command here).
cat > "$work/fake-ssh" <<SH
#!/usr/bin/env bash
echo "\$1" >> "$work/remote.log"
shift
exec bash -c "\$*"
SH
chmod +x "$work/fake-ssh"
write_config "$work/small.yaml" bsp 1 "$(pick_port_base)" 8000
"$ROOT/scripts/launch.sh" run --config "$work/small.yaml" --hosts "$work/hosts" \
  --run-dir "$work/remote" --bin-dir "$BUILD_DIR/bin" --remote-all \
  --remote-cmd "$work/fake-ssh" --quiet --timeout 300 || fail "remote run failed"
[[ "$(json_field "$work/remote/summary.json" state)" == succeeded ]] || fail "remote run did not succeed"
n="$(grep -c '^127.0.0.1$' "$work/remote.log")"
(( n >= 5 )) || fail "remote command used $n times, expected >= 5 (one per daemon)"
assert_nothing_left "$work/remote"
echo "ok: remote command used $n times"

# wait_running ADDR: until the job has trained some samples (bounded).
wait_running() {
  for _ in $(seq 1 300); do
    if grep -qE '"samples": "[1-9]' <<< "$("$STRATA" status --master "$1" --json 2>/dev/null || true)"; then
      return 0
    fi
    sleep 0.1
  done
  fail "job at $1 did not start training"
}

# start_long_run NAME: `launch.sh run` of a long job in the background, in
# run dir $work/NAME; returns once it trains. Sets $launcher.
start_long_run() {
  local base; base="$(pick_port_base)"
  write_config "$work/$1.yaml" bsp 50 "$base"
  "$ROOT/scripts/launch.sh" run --config "$work/$1.yaml" --hosts "$work/hosts" \
    --run-dir "$work/$1" --bin-dir "$BUILD_DIR/bin" --quiet > "$work/$1.out" 2>&1 &
  launcher=$!
  wait_running "127.0.0.1:$base"
}

# 2. SIGTERM to launch.sh run: it stops the cluster and exits non-zero.
# launcher_exit WHAT: waits up to 30 s for the launcher to end (failing
# with "launch.sh WHAT within 30 s" otherwise); its exit status in $rc.
launcher_exit() {
  for _ in $(seq 1 300); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$launcher" 2>/dev/null && fail "launch.sh $1 within 30 s"
  set +e; wait "$launcher"; rc=$?; set -e
}

start_long_run int
kill -TERM "$launcher"
launcher_exit "did not end after SIGTERM"
(( rc != 0 )) || fail "interrupted run exited 0"
assert_nothing_left "$work/int"
echo "ok: interrupted run exited $rc, nothing left"

# 3. A pserver killed mid-job without replication or checkpoints: launch.sh
#    restarts it, but its partitions are lost: the run fails, says which
#    pserver died and why, and stops the rest.
start_long_run kill
read -r _ pid < "$work/kill/pids/pserver-0"
kill -KILL "$pid"
launcher_exit "did not notice the dead pserver"
cat "$work/kill.out"
(( rc != 0 )) || fail "run with a dead pserver exited 0"
# Named by launch.sh (it saw the process go) or by the master's summary
# (it saw the heartbeats stop first): whichever noticed first.
grep -qE "pserver-0 exited|pserver 0 \(node [0-9]+, 127.0.0.1\) died" "$work/kill.out" ||
  fail "the dead pserver is not named"

grep -q "no replica to take over" "$work/kill.out" || fail "the run does not say why it failed"
assert_nothing_left "$work/kill"

# 4. The master killed mid-job: launch.sh restarts it, it carries on from its
#    state directory and the job trains on (tests/faults/master_kill_test.sh
#    runs one to the end); SIGTERM then stops everything.
start_long_run nomaster
read -r _ pid < "$work/nomaster/pids/master-0"
kill -KILL "$pid"
addr="$(cat "$work/nomaster/master.address")"
samples() {  # "" while the master is away
  { "$STRATA" status --master "$addr" --json 2>/dev/null || true; } |
    sed -n 's/.*"samples": "\([0-9]*\)".*/\1/p' | head -n 1
}
a=""
for _ in $(seq 1 150); do a="$(samples)"; [[ -n "$a" ]] && break; sleep 0.1; done
[[ -n "$a" ]] || fail "the master did not come back"
b="$a"
for _ in $(seq 1 150); do b="$(samples)"; (( ${b:-0} > a )) && break; sleep 0.1; done
(( ${b:-0} > a )) || fail "the job did not train on after the master's restart ($a samples)"
grep -q "master-0 failed (code 137); restarting" "$work/nomaster.out" ||
  fail "launch.sh did not say it restarted the master: $(cat "$work/nomaster.out")"
kill -TERM "$launcher"
launcher_exit "did not end after SIGTERM"
assert_nothing_left "$work/nomaster"
echo "PASS"

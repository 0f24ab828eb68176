#!/usr/bin/env bash
# The same pserver killed again each time it comes back: launch.sh restarts
# it (with backoff) until its restart budget is spent, then fails the run
# cleanly, saying why, with nothing left running: no restart loop.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
fault_config 1 40
start_job loop --restart-budget 2
wait_for_samples loop 20000
kills=0
for _ in $(seq 1 600); do  # 60 s at most
  kill -0 "$RUN_PID" 2>/dev/null || break
  pid="$(pid_of loop pserver-1)"
  if [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null; then kills=$((kills + 1)); fi
  sleep 0.1
done
rc=0
wait_job || rc=$?
(( rc == 1 )) || fail "launch.sh exited $rc, expected 1 (a failed run): $(why loop)"
grep -q 'pserver-1 failed again (code 137) after 2 restart(s) in 60 s: restart budget spent' "$WORK/loop.out" ||
  fail "no restart-budget message: $(cat "$WORK/loop.out")"
(( $(grep -c 'pserver-1 failed (code 137); restarting' "$WORK/loop.out") == 2 )) ||
  fail "expected exactly 2 restarts: $(cat "$WORK/loop.out")"
echo "pserver 1 killed $kills time(s); restarted twice, then the run failed cleanly"
assert_nothing_left "$WORK"

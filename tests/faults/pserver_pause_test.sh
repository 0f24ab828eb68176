#!/usr/bin/env bash
# SIGSTOP of a pserver for longer than its lease (replication 1): the master
# declares it dead and fails its partitions over; when it wakes (SIGCONT)
# it is fenced: its lease has expired, every request to it is refused, the
# master tells it it was declared dead, and it exits (75) so that a fresh
# one joins. No acknowledged update is lost; the accuracy stays within 1%.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
fault_config 1 6
baseline_then_start pause 60000
pid="$(pid_of pause pserver-1)"
t0="$(now)"
kill -STOP "$pid"
wait_declared_dead PSERVER 1
[[ -n "$detected" ]] || fail "the paused pserver was not declared dead within 15 s"
# Training goes on without it.
expect_training_goes_on pause "training did not go on while pserver 1 was paused"
kill -CONT "$pid"
# It notices, refuses everything and exits with 75.
for _ in $(seq 1 200); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
kill -0 "$pid" 2>/dev/null && fail "the woken pserver did not exit"
log="$WORK/run-pause/logs/pserver-1.log"
grep -q 'fenced: ' "$log" || fail "the woken pserver does not say it was fenced: $(tail -5 "$log")"
wait_job || fail "the job failed: $(why pause)"
# No worker may have given up on a request meanwhile (a partition that
# stopped answering: its requests time out and the worker restarts).
! grep -q 'worker-[0-9]* failed' "$WORK/pause.out" ||
  fail "a worker failed and was restarted during the fault: $(why pause)"
grep -q 'pserver-1 failed (code 75); restarting' "$WORK/pause.out" ||
  fail "the fenced pserver did not exit with 75, or was not restarted: $(cat "$WORK/pause.out")"
[[ "$(ledger_field pause lost)" == 0 ]] || fail "acknowledged updates lost: $(cat "$(summary pause)")"
(( $(summary_field pause failovers) >= 1 )) || fail "no failover recorded"
assert_accuracy_close pause base
echo "paused pserver declared dead after $(secs "$t0" "$detected") s; fenced on waking;" \
  "ledger: $(ledger_field pause acked) acknowledged, $(ledger_field pause lost) lost"
throughput pause "$detected"
assert_nothing_left "$WORK"

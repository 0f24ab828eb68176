#!/usr/bin/env bash
# SIGKILL of a pserver with replication 1: its partitions fail over to their
# backups, the job finishes with the fault-free run's accuracy, and no
# acknowledged update is lost (the update ledger: every push a worker had
# acknowledged is in the partitions). Prints the detection and recovery
# times (docs/reliability.md).
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
fault_config 1 6
baseline_then_start kill 60000
v0="$(pserver_version 0)"
t0="$(now)"
kill -KILL "$(pid_of kill pserver-1)"
detected="" recovered=""
for _ in $(seq 1 400); do  # 20 s at most
  [[ -z "$detected" && "$(node_state PSERVER 1)" != ALIVE ]] && detected="$(now)"
  if [[ -n "$detected" ]]; then
    # The first step completed after the kill, on a surviving pserver.
    v="$(pserver_version 0 2>/dev/null || echo 0)"
    (( v > v0 + 1 )) && { recovered="$(now)"; break; }
  fi
  sleep 0.05
done
[[ -n "$detected" ]] || fail "pserver 1 was not declared dead within 20 s"
[[ -n "$recovered" ]] || fail "training did not go on after the failover"
wait_job || fail "the job failed after the kill: $(why kill)"

(( $(summary_field kill failovers) >= 1 )) || fail "no failover recorded"
[[ "$(ledger_field kill lost)" == 0 ]] || fail "acknowledged updates lost: $(cat "$(summary kill)")"
(( $(ledger_field kill acked) > 0 )) || fail "the ledger saw no acknowledged push"
grep -q 'failed over to their backups' "$(summary kill)" || fail "no failover event in the summary"
grep -q 'pserver-1 failed (code 137); restarting' "$WORK/kill.out" ||
  fail "launch.sh did not restart the killed pserver: $(cat "$WORK/kill.out")"
assert_accuracy_close kill base
if [[ "${TEST_SECURITY:-}" == mtls ]]; then
  # (ctest runs this one under mTLS:) the death moved the data-plane key
  # epoch, and the workers went on with the new keys.
  grep -q 'data-plane keys of key epoch' "$WORK/run-kill/logs/worker-0.log" ||
    fail "no data-plane key rotation after the pserver's death"
fi
echo "detection $(secs "$t0" "$detected") s, recovery (kill to the next step) $(secs "$t0" "$recovered") s," \
  "ledger: $(ledger_field kill acked) pushes acknowledged, $(ledger_field kill lost) lost"
throughput kill "$recovered"
assert_nothing_left "$WORK"

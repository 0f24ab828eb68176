#!/usr/bin/env bash
# Elastic scaling across hosts (docs/operations.md, "Scaling"): four
# network namespaces joined by a bridge, each with its own address and
# sshd (tests/ops/hosts_lib.sh), launch.sh starting every daemon over ssh.
# A bsp job with replication 1 starts with 1 pserver and 1 worker on host
# 2; hosts 3 and 4 have room for a pserver and a worker each. While it
# trains it grows to 3 pservers + 3 workers (the master's provider starts
# them on hosts 3 and 4 over ssh; partitions move to the new pservers
# across the bridge), then shrinks to 2 pservers + 1 worker (pserver 2's
# partitions and backups move back, it exits 0). It finishes with every
# record trained once, the update ledger's lost 0, and test accuracy within
# 1% of the same job run at a fixed size (1 + 1) on the same hosts.
BUILD_DIR="$1"
source "$(dirname "$0")/../e2e/lib.sh"
source "$(dirname "$0")/hosts_lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
[[ $(id -u) -eq 0 ]] || skip "needs root for network namespaces"
[[ -x /usr/sbin/sshd ]] || skip "openssh-server is not installed (apt-get install openssh-server)"
command -v ip > /dev/null || skip "iproute2 is not installed"

work="$(mktemp -d /tmp/strata-mh-XXXXXX)"
tag="$$"
bridge="smb$tag"
subnet=10.214.$((tag % 200 + 20))
veth="sc$tag"
hosts=(1 2 3 4)
ns_of() { echo "strata-mh-$tag-$1"; }
remote="ssh -F $work/ssh/config"

cleanup() {
  set +e
  for run in fixed run; do
    "$ROOT/scripts/launch.sh" down --run-dir "$work/$run" --remote-cmd "$remote" > /dev/null 2>&1
  done
  stop_sshds "$work/ssh"
  remove_hosts
  pkill -KILL -f -- "$work" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
make_hosts
start_sshds "$work/ssh"

base=7400
epochs=16  # (long enough for ssh starts under a loaded machine)
# The same job at a fixed size, on host 2: the accuracy to match (no
# replication: 1 pserver has no other to back it up, and replication does
# not change what is trained).
write_config "$work/fixed.yaml" bsp "$epochs" "$base" 0
cp "$work/fixed.yaml" "$work/job.yaml"
sed -i 's/^cluster:$/cluster:\n  replication: 1/' "$work/job.yaml"
printf 'elastic:\n  max_pservers: 3\n  max_workers: 3\n  max_moves: 2\n  move_rate_mb_per_s: 8\n' \
  >> "$work/job.yaml"
printf '%s master\n%s pserver worker\n' "$(addr_of 1)" "$(addr_of 2)" > "$work/fixed-hosts"
"$ROOT/scripts/launch.sh" run --config "$work/fixed.yaml" --hosts "$work/fixed-hosts" --quiet \
  --remote-cmd "$remote" --run-dir "$work/fixed" --bin-dir "$BUILD_DIR/bin" --timeout 400 \
  > "$work/fixed.out" 2>&1 || { tail -n 20 "$work/fixed.out"; fail "the fixed-size job failed"; }
fixed_acc="$(json_field "$work/fixed/summary.json" final_test_accuracy)"

{
  echo "$(addr_of 1) master"
  echo "$(addr_of 2) pserver worker"
  echo "$(addr_of 3) pserver=0..1 worker=0..1"
  echo "$(addr_of 4) pserver=0..1 worker=0..1"
} > "$work/hosts"
master="$(addr_of 1):$base"
"$ROOT/scripts/launch.sh" run --config "$work/job.yaml" --hosts "$work/hosts" --quiet \
  --remote-cmd "$remote" --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" --timeout 400 \
  > "$work/run.out" 2>&1 &
launcher=$!
wait_steps "$master" 50
log="$work/run/logs/master-0.log"

# scale ARGS... EXPECTED: `strata scale` done, its answer holding EXPECTED.
scale() {
  local want="${*: -1}" out
  out="$("$STRATA" scale --master "$master" "${@:1:$#-1}" --timeout 120 2>&1)" ||
    fail "strata scale ${*:1:$#-1} failed: $out"$'\n'"$(tail -n 20 "$log")"
  echo "$out"
  grep -qE "$want" <<< "$out" || fail "strata scale ${*:1:$#-1}: $out"
}
scale --pservers 3 'scale done \(pservers 1 -> 3: starting pservers 1, 2.*the partitions are balanced'
scale --workers 3 'scale done \(workers 1 -> 3: starting workers 1, 2'
# Each added daemon registered from the host that had room for it.
for h in 3 4; do
  i=$((h - 2))
  grep -q "pserver $i registered as node [0-9]* from ipv4:$(addr_of "$h"):" "$log" ||
    fail "pserver $i did not register from host $(addr_of "$h")"
  grep -q "worker $i registered as node [0-9]* from ipv4:$(addr_of "$h"):" "$log" ||
    fail "worker $i did not register from host $(addr_of "$h")"
done
moved_in="$(grep -c '"kind": "moved"' "$work/run/events.jsonl")"
(( moved_in > 0 )) || fail "no partition moved to the pservers added"
scale --pservers 2 'scale done \(pservers 3 -> 2: draining pserver 2'
scale --workers 1 'scale done \(workers 3 -> 1'
for _ in $(seq 1 100); do
  [[ -f "$work/run/exit/pserver-2" ]] && break
  sleep 0.1
done
[[ "$(cat "$work/run/exit/pserver-2" 2>/dev/null)" == 0 ]] ||
  fail "pserver 2 did not exit 0 (exit: $(cat "$work/run/exit/pserver-2" 2>/dev/null))"

set +e; wait "$launcher"; rc=$?; set -e
(( rc == 0 )) || { tail -n 30 "$work/run.out"; fail "launch.sh run exited $rc"; }
summary="$work/run/summary.json"
check_scaled_job "$summary" "1 + 1 -> 3 + 3 -> 2 + 1 across hosts" "$fixed_acc" 0.01 "$epochs" replicated
moved="$(grep -c '"kind": "moved"' "$work/run/events.jsonl")"
assert_hosts_idle
echo "PASS: scaled 1 + 1 -> 3 + 3 -> 2 + 1 across 4 hosts over ssh, $moved partitions moved ($moved_in in), nothing lost"

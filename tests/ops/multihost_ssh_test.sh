#!/usr/bin/env bash
# Multi-host bring-up over ssh, on real hosts made on this machine: five
# network namespaces joined by a bridge, each with its own address and its
# own sshd (Debian's openssh-server, keys made for the test). launch.sh
# runs a training job from a host file of distinct hosts (1 master, 2
# pserver and 2 worker hosts), starting every daemon over ssh. Checks: the
# job succeeds with a sane accuracy, each daemon ran on its own host (the
# master saw each node register from its host's address), and afterwards
# nothing is left running (no daemon, no sshd, nothing in a namespace) or
# mounted (no namespace mounts), the bridge and the namespaces gone. While
# it trains, `strata scale` adds a worker on host 5 (its line has room:
# worker=1..2): the master's provider (launch.sh provide, on host 1) starts
# it there over ssh, with its own certificate.
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
subnet=10.213.$((tag % 200 + 20))
veth="sm$tag"
hosts=(1 2 3 4 5)
ns_of() { echo "strata-mh-$tag-$1"; }

cleanup() {
  set +e
  "$ROOT/scripts/launch.sh" down --run-dir "$work/run" --remote-cmd "ssh -F $work/ssh/config" \
    > /dev/null 2>&1
  stop_sshds "$work/ssh"
  remove_hosts
  pkill -KILL -f -- "$work" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# The hosts: a bridge in this namespace, a veth into each host's namespace.
make_hosts

# An sshd in each, with host and user keys made now.
start_sshds "$work/ssh"

# The job: Fashion-MNIST, bsp, every daemon on a host of its own.
base=7300
# (mTLS: launch.sh makes a certificate for each host, its address in it.)
TEST_SECURITY=mtls write_config "$work/job.yaml" bsp 50 "$base" 12000
{
  echo "# One daemon a host: reached over ssh."
  echo "$(addr_of 1) master"
  echo "$(addr_of 2) pserver"
  echo "$(addr_of 3) pserver"
  echo "$(addr_of 4) worker"
  echo "$(addr_of 5) worker=1..2"
} > "$work/hosts"
# strata validate reaches every host over ssh and finds its ports free.
"$STRATA" validate --config "$work/job.yaml" --hosts "$work/hosts" --remote-cmd "ssh -F $work/ssh/config" \
  > "$work/validate.out" 2>&1 || { cat "$work/validate.out"; fail "strata validate refused the hosts"; }
for h in "${hosts[@]}"; do
  grep -q "^$(addr_of "$h"): ok$" "$work/validate.out" || { cat "$work/validate.out"; fail "validate: host $h not ok"; }
done
[[ $(grep -c 'ok    reach: through `ssh -F' "$work/validate.out") == 5 ]] || fail "validate did not reach 5 hosts over ssh"
grep -q "ok    port $((base + 11)): $(addr_of 3):$((base + 11)) is free" "$work/validate.out" ||
  { cat "$work/validate.out"; fail "validate did not check pserver-1's port on its host"; }
# A port in use on host 3 (pserver-1's data port, in that host's namespace):
# validate names the host and the port, and launch.sh starts nothing.
ip netns exec "$(ns_of 3)" python3 -c "import socket, time
s = socket.socket(); s.bind(('$(addr_of 3)', $((base + 21)))); s.listen(); time.sleep(120)" &
holder=$!
for _ in $(seq 1 50); do
  ip netns exec "$(ns_of 3)" ss -ltn | grep -q ":$((base + 21)) " && break
  sleep 0.1
done
set +e
"$STRATA" validate --config "$work/job.yaml" --hosts "$work/hosts" --remote-cmd "ssh -F $work/ssh/config" \
  > "$work/validate2.out" 2>&1; rc=$?
"$ROOT/scripts/launch.sh" up --config "$work/job.yaml" --hosts "$work/hosts" --remote-cmd "ssh -F $work/ssh/config" \
  --run-dir "$work/refused" --bin-dir "$BUILD_DIR/bin" > "$work/up-refused.out" 2>&1; up_rc=$?
set -e
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null || true
[[ $rc == 1 ]] && grep -q "^$(addr_of 3): FAILED" "$work/validate2.out" &&
  grep -q "FAIL  port $((base + 21)): $(addr_of 3):$((base + 21)) is in use" "$work/validate2.out" ||
  { cat "$work/validate2.out"; fail "validate did not find the port in use on host 3 (rc $rc)"; }
[[ $up_rc == 2 ]] && grep -q "launch.sh: validate: .*$(addr_of 3):$((base + 21)) is in use" "$work/up-refused.out" ||
  { cat "$work/up-refused.out"; fail "launch.sh up did not refuse the busy port (rc $up_rc)"; }
compgen -G "$work/refused/pids/*" > /dev/null && fail "launch.sh started daemons despite the busy port"
# A host that does not answer: named, with what ssh said.
printf '%s master\n%s pserver worker\n' "$(addr_of 1)" "$subnet.99" > "$work/hosts-down"
set +e
"$STRATA" validate --config "$work/job.yaml" --hosts "$work/hosts-down" --remote-cmd "ssh -F $work/ssh/config" \
  > "$work/validate3.out" 2>&1; rc=$?
set -e
[[ $rc == 1 ]] && grep -q "^$subnet.99: FAILED" "$work/validate3.out" &&
  grep -q "FAIL  reach: cannot reach $subnet.99 through \`ssh -F" "$work/validate3.out" ||
  { cat "$work/validate3.out"; fail "validate did not name the unreachable host (rc $rc)"; }
"$ROOT/scripts/launch.sh" run --config "$work/job.yaml" --hosts "$work/hosts" --quiet \
  --remote-cmd "ssh -F $work/ssh/config" --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" \
  --timeout "${MH_TIMEOUT:-400}" > "$work/out" 2>&1 &
launcher=$!
for _ in $(seq 1 300); do [[ -f "$work/run/tls/admin/client.crt" ]] && break; sleep 0.1; done
export STRATA_TLS_DIR="$work/run/tls/admin"
wait_steps "$(addr_of 1):$base" 20
scale_out="$("$STRATA" scale --master "$(addr_of 1):$base" --workers 3 2>&1)" ||
  { echo "$scale_out"; tail -n 20 "$work/run/logs/master-0.log"; fail "strata scale over ssh failed"; }
grep -q 'scale done (workers 2 -> 3: starting worker 2)' <<< "$scale_out" || fail "scale: $scale_out"
set +e; wait "$launcher"; rc=$?; set -e
(( rc == 0 )) || { cat "$work/out"; tail -n 30 "$work"/run/logs/*.log; fail "launch.sh over ssh failed"; }
s="$work/run/summary.json"
[[ "$(json_field "$s" state)" == succeeded ]] || { cat "$s"; fail "the job did not succeed"; }
acc="$(json_field "$s" final_test_accuracy)"
python3 -c "import sys; sys.exit(0 if $acc > 0.7 else 1)" || fail "test accuracy $acc is not above 0.7"
# Each node registered from its own host, with its instance's certificate
# of that host (gen-certs.sh numbers them as the launch plan does).
log="$work/run/logs/master-0.log"
grep -q "control plane: mTLS, certificate $work/run/tls/$(addr_of 3)/pserver-1.crt" \
  "$work/run/logs/pserver-1.log" || fail "pserver 1 did not use its own certificate on its host"
grep -q "control plane: mTLS, certificate $work/run/tls/$(addr_of 5)/worker-1.crt" \
  "$work/run/logs/worker-1.log" || fail "worker 1 did not use its own certificate on its host"
for i in 0 1; do
  grep -q "pserver $i registered as node [0-9]* from ipv4:$(addr_of $((i + 2))):" "$log" ||
    fail "pserver $i did not register from host $(addr_of $((i + 2)))"
  grep -q "worker $i registered as node [0-9]* from ipv4:$(addr_of $((i + 4))):" "$log" ||
    fail "worker $i did not register from host $(addr_of $((i + 4)))"
done
# The worker the scale added: on host 5 (the room), its own certificate.
grep -q "worker 2 registered as node [0-9]* from ipv4:$(addr_of 5):" "$log" ||
  fail "worker 2 (added by strata scale) did not register from host $(addr_of 5)"
grep -q "control plane: mTLS, certificate $work/run/tls/$(addr_of 5)/worker-2.crt" \
  "$work/run/logs/worker-2.log" || fail "worker 2 did not use its own certificate on host 5"

# Nothing left: no daemon in any namespace, then no sshd, no namespace, no mount.
assert_hosts_idle
ssh -F "$work/ssh/config" -O exit "$(addr_of 1)" > /dev/null 2>&1 || true
for h in "${hosts[@]}"; do
  ssh -F "$work/ssh/config" -O exit "$(addr_of "$h")" > /dev/null 2>&1 || true
  kill "$(cat "$work/ssh/sshd-$h.pid")"
  ip netns pids "$(ns_of "$h")" | xargs -r kill -KILL 2>/dev/null || true
  ip netns del "$(ns_of "$h")"
done
ip link del "$bridge"
assert_nothing_left "$work"
if grep -q "strata-mh-$tag-" /proc/self/mountinfo; then
  fail "namespace mounts left: $(grep "strata-mh-$tag-" /proc/self/mountinfo)"
fi
ip link show "$bridge" > /dev/null 2>&1 && fail "bridge $bridge left"
echo "PASS: 5 hosts over ssh, a worker added over ssh by strata scale, test accuracy $acc; nothing left running or mounted"

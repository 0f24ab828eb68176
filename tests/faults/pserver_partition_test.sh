#!/usr/bin/env bash
# A pserver cut off from the workers but not from the master (or the other
# pservers): each daemon runs in a network namespace of its own, joined by a
# bridge, and the workers' namespaces get an unreachable route to pserver
# 1. Its heartbeats still reach the master, the workers' requests do not:
# they report it, the master's probes still answer, and after
# dead_timeout_ms of reports it is declared dead and its partitions fail
# over to their backups (replication 1). The job finishes within 1% of the
# fault-free run's accuracy with no acknowledged update lost.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
command -v ip > /dev/null || skip "no ip(8) (iproute2) to make network namespaces"

tag="st$$"
net=$(( 100 + RANDOM % 100 ))
br="${tag}br"
declare -A NS=([10]=m [20]=p0 [21]=p1 [22]=p2 [30]=w0 [31]=w1)
cleanup_net() {
  for h in "${!NS[@]}"; do ip netns del "$tag-${NS[$h]}" 2>/dev/null; done
  ip link del "$br" 2>/dev/null
  true
}
trap 'r=$?; cleanup_net; cleanup_fault "$r"' EXIT
if ! ip link add "$br" type bridge 2>/dev/null; then
  skip "cannot make network namespaces here (ip link add: not permitted)"
fi
ip link set "$br" up
ip addr add "10.$net.0.1/24" dev "$br"
for h in "${!NS[@]}"; do
  ns="$tag-${NS[$h]}"
  ip netns add "$ns"
  ip link add "$tag${NS[$h]}" type veth peer name eth0 netns "$ns"
  ip link set "$tag${NS[$h]}" master "$br" up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip addr add "10.$net.0.$h/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
done
# The remote command: run the daemons of host 10.N.0.H in its namespace.
cat > "$WORK/nsexec" <<SH
#!/usr/bin/env bash
h="\${1##*.}"; shift
declare -A NS=([10]=m [20]=p0 [21]=p1 [22]=p2 [30]=w0 [31]=w1)
exec ip netns exec "$tag-\${NS[\$h]}" bash -c "\$*"
SH
chmod +x "$WORK/nsexec"

fault_config 1 6
printf '10.%s.0.10 master\n10.%s.0.20 pserver\n10.%s.0.21 pserver\n10.%s.0.22 pserver\n10.%s.0.30 worker\n10.%s.0.31 worker\n' \
  $net $net $net $net $net $net > "$WORK/hosts"
export STRATA_REMOTE_CMD="$WORK/nsexec"
master_status() { curl -sf "http://10.$net.0.10:$((BASE + 1))/status"; }

baseline_then_start cut 60000
t0="$(now)"
for w in w0 w1; do ip netns exec "$tag-$w" ip route add unreachable "10.$net.0.21"; done
wait_declared_dead PSERVER 1
[[ -n "$detected" ]] || fail "pserver 1, cut off from the workers, was not declared dead within 15 s"
wait_job || fail "the job failed: $(why cut)"
s="$(summary cut)"
grep -q 'pserver 1 (node [0-9]*, 10\.[0-9.]*) declared dead: unreachable from workers' "$s" ||
  fail "pserver 1 was not declared dead for being unreachable from the workers: $(cat "$s")"
(( $(summary_field cut failovers) >= 1 )) || fail "no failover"
[[ "$(ledger_field cut lost)" == 0 ]] || fail "acknowledged updates lost: $(cat "$s")"
grep -q 'fenced: ' "$WORK/run-cut/logs/pserver-1.log" || fail "pserver 1 was not fenced"
assert_accuracy_close cut base
echo "pserver 1 cut off from the workers: declared dead after $(secs "$t0" "$detected") s" \
  "(its heartbeats went on); ledger: $(ledger_field cut acked) acknowledged, 0 lost"
throughput cut "$detected"

#!/usr/bin/env bash
# conf/nftables-strata.nft, the per-host cap on connections to Strata's
# control ports (docs/security.md, "Limits"), on real hosts made on this
# machine: three network namespaces joined by a bridge. Host 1 runs a real
# strata-master with the rules loaded (the cap lowered to 8 for the test);
# host 2 opens 12 raw TCP connections to its gRPC port and gets 8, and
# while it holds them its own `strata status` is refused, host 3's is
# answered; once host 2 lets go, its `strata status` is answered again.
# Loading the file twice replaces the table (no duplicate rules).
BUILD_DIR="$1"
source "$(dirname "$0")/../e2e/lib.sh"
source "$(dirname "$0")/hosts_lib.sh"
[[ $(id -u) -eq 0 ]] || skip "needs root for network namespaces"
command -v nft > /dev/null || skip "nftables is not installed (apt-get install nftables)"
command -v ip > /dev/null || skip "iproute2 is not installed"
command -v python3 > /dev/null || skip "python3 is not installed"

work="$(mktemp -d /tmp/strata-cap-XXXXXX)"
tag="$$"
bridge="scb$tag"
subnet=10.214.$((tag % 200 + 20))
veth="sc$tag"
hosts=(1 2 3)
ns_of() { echo "strata-cap-$tag-$1"; }
master_pid=""
cleanup() {
  set +e
  [[ -n $master_pid ]] && kill -KILL "$master_pid" 2>/dev/null
  remove_hosts
  rm -rf "$work"
}
trap cleanup EXIT

make_hosts
server="$(addr_of 1)"
in_ns() { local h="$1"; shift; ip netns exec "$(ns_of "$h")" "$@"; }
status_from() {  # status_from HOST: strata status from that host, its exit code
  in_ns "$1" timeout 20 "$BUILD_DIR/bin/strata" status --master "$server:7070" --plaintext \
    > "$work/status-$1.txt" 2>&1
}

# The rules, with the cap lowered to 8, loaded twice.
sed 's/ct count over 64/ct count over 8/' "$ROOT/conf/nftables-strata.nft" > "$work/rules.nft"
grep -q "ct count over 8" "$work/rules.nft" || fail "the rules file has no cap to lower"
in_ns 1 nft -f "$work/rules.nft" || fail "nft -f conf/nftables-strata.nft failed"
in_ns 1 nft -f "$work/rules.nft" || fail "loading the rules a second time failed"
[[ $(in_ns 1 nft list table inet strata | grep -c "ct count over 8") -eq 2 ]] ||
  fail "after two loads the table does not hold exactly its two rules"

# A real master on host 1 (plain text: the cap does not depend on TLS).
sed 's/^  mode: mtls.*/  mode: plaintext/' "$ROOT/conf/local.yaml" > "$work/job.yaml"
echo "$server master pserver worker" > "$work/hosts"
in_ns 1 "$BUILD_DIR/bin/strata-master" --config "$work/job.yaml" --hosts "$work/hosts" \
  --host "$server" --logtostderr > "$work/master.log" 2>&1 &
master_pid=$!
disown "$master_pid"  # (killed by cleanup: no job report)
for _ in $(seq 1 100); do status_from 3 && break; sleep 0.2; done
status_from 3 || { tail -n 20 "$work/master.log"; cat "$work/status-3.txt"; fail "the master never answered"; }

# Host 2 takes 12 connections and holds what it got until told to let go.
cat > "$work/hold.py" <<PY
import os, socket, sys, time
held = []
for _ in range(12):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(("$server", 7070))
        held.append(s)
    except OSError:
        pass
with open("$work/held", "w") as f:
    f.write(str(len(held)))
deadline = time.time() + 60
while not os.path.exists("$work/release") and time.time() < deadline:
    time.sleep(0.05)
PY
in_ns 2 python3 "$work/hold.py" &
holder=$!
for _ in $(seq 1 300); do [[ -s $work/held ]] && break; sleep 0.1; done
[[ $(cat "$work/held" 2>/dev/null) == 8 ]] || fail "host 2 got $(cat "$work/held" 2>/dev/null) of 12 connections, not 8"
status_from 2 && fail "host 2's strata status got through with 8 connections held"
status_from 3 || { cat "$work/status-3.txt"; fail "host 3 was refused while host 2 was at its cap"; }
touch "$work/release"
wait "$holder"
for _ in $(seq 1 50); do status_from 2 && break; sleep 0.2; done
status_from 2 || { cat "$work/status-2.txt"; fail "host 2 was still refused after it let go"; }
refused="$(in_ns 1 nft list table inet strata | awk '/ip saddr ct count/ {for (i = 1; i < NF; i++) if ($i == "packets") print $(i + 1)}')"
[[ ${refused:-0} -ge 4 ]] || fail "the rule counted ${refused:-0} refused connections, at least 4 expected"
echo "PASS: 8 of 12 connections from one host, the rest reset ($refused refused); other hosts unaffected"

# Hosts made on this machine for the multi-host ops tests: network
# namespaces joined by a bridge, each with its own address. Sourced after
# tests/e2e/lib.sh; the caller sets
#   bridge     the bridge's name (15 characters at most)
#   subnet     a /24 prefix such as 10.213.40 (the bridge is .1)
#   hosts      the host numbers, e.g. (1 2 3)
#   veth       a short prefix for the veth pairs' names
# and defines ns_of H (the namespace of host H).

addr_of() { echo "$subnet.$((10 + $1))"; }

# make_hosts: the bridge, then a veth into each host's namespace, its end
# there named eth0 with the host's address. Skips the test where bridges
# cannot be made.
make_hosts() {
  local h ns
  ip link add "$bridge" type bridge || skip "cannot make a bridge here"
  ip addr add "$subnet.1/24" dev "$bridge"
  ip link set "$bridge" up
  for h in "${hosts[@]}"; do
    ns="$(ns_of "$h")"
    ip netns add "$ns"
    ip link add "${veth}v${h}" type veth peer name "${veth}p${h}"
    ip link set "${veth}p${h}" netns "$ns"
    ip link set "${veth}v${h}" master "$bridge" up
    ip -n "$ns" link set "${veth}p${h}" name eth0
    ip -n "$ns" addr add "$(addr_of "$h")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
}

# remove_hosts: whatever is left in the namespaces killed, the namespaces
# and the bridge deleted (never fails: for cleanup traps).
remove_hosts() {
  local h
  for h in "${hosts[@]}"; do
    ip netns pids "$(ns_of "$h")" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
    ip netns del "$(ns_of "$h")" 2>/dev/null
  done
  ip link del "$bridge" 2>/dev/null
  return 0
}

# write_ssh_config DIR: DIR/config, how the tests reach the hosts: as root
# with the key DIR/id, host keys learnt on first use into DIR/known_hosts,
# never a password prompt, one control connection a host.
write_ssh_config() {
  local dir="$1"
  cat > "$dir/config" <<CONF
Host $subnet.*
  User root
  IdentityFile $dir/id
  IdentitiesOnly yes
  UserKnownHostsFile $dir/known_hosts
  StrictHostKeyChecking accept-new
  BatchMode yes
  ConnectTimeout 5
  LogLevel ERROR
  ControlMaster auto
  ControlPath $dir/cm-%h
  ControlPersist 120
CONF
}

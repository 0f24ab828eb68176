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

# shape_link HOST MBIT [BURST] [LATENCY_MS]: tc tbf shapes both directions
# of HOST's link (its eth0, and the bridge's end of its veth) to MBIT
# Mbit/s, with BURST (64kb) and a queue of at most LATENCY_MS (100).
shape_link() {
  local ns; ns="$(ns_of "$1")"
  ip -n "$ns" link set eth0 txqueuelen 1000
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "${2}mbit" burst "${3:-64kb}" latency "${4:-100}ms"
  tc qdisc add dev "${veth}v$1" root tbf rate "${2}mbit" burst "${3:-64kb}" latency "${4:-100}ms"
}

# write_ns_exec FILE: launch.sh's --remote-cmd for these hosts (FILE, made
# executable): `FILE ADDRESS COMMAND...` runs COMMAND in the namespace of
# the host at ADDRESS.
write_ns_exec() {
  local prefix; prefix="$(ns_of 0)"; prefix="${prefix%0}"
  cat > "$1" <<SH
#!/usr/bin/env bash
h=\$(( \${1##*.} - 10 )); shift
exec ip netns exec "$prefix\$h" bash -c "\$*"
SH
  chmod +x "$1"
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

# start_sshds DIR: an sshd in each host's namespace on its address, with
# host and user keys made now in DIR (its pid file DIR/sshd-H.pid), the
# ssh config DIR/config written, and each host reached once through it
# (and checked to be the namespace of its address).
start_sshds() {
  local dir="$1" h
  mkdir -p "$dir" /run/sshd
  ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/id"
  cp "$dir/id.pub" "$dir/authorized_keys"
  for h in "${hosts[@]}"; do
    cat > "$dir/sshd-$h.conf" <<CONF
ListenAddress $(addr_of "$h")
HostKey $dir/host_key
PidFile $dir/sshd-$h.pid
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
CONF
    ip netns exec "$(ns_of "$h")" /usr/sbin/sshd -f "$dir/sshd-$h.conf" -E "$dir/sshd-$h.log" ||
      fail "sshd did not start on host $h"
  done
  write_ssh_config "$dir"
  for h in "${hosts[@]}"; do
    for _ in $(seq 1 50); do
      ssh -F "$dir/config" "$(addr_of "$h")" true 2> "$dir/client.err" && break
      sleep 0.1
    done
    [[ "$(ssh -F "$dir/config" "$(addr_of "$h")" 'ip -4 -o addr show eth0' | awk '{print $4}')" == \
       "$(addr_of "$h")/24" ]] || { cat "$dir/client.err"; fail "ssh to host $h does not reach its namespace"; }
  done
}

# stop_sshds DIR: the sshds start_sshds started, and the control
# connections to them, ended (never fails: for cleanup traps).
stop_sshds() {
  local dir="$1" h
  for h in "${hosts[@]}"; do
    ssh -F "$dir/config" -O exit "$(addr_of "$h")" > /dev/null 2>&1
    [[ -f $dir/sshd-$h.pid ]] && kill "$(cat "$dir/sshd-$h.pid")" 2>/dev/null
  done
  return 0
}

# assert_hosts_idle: nothing but sshd left running in any host's
# namespace.
assert_hosts_idle() {
  local h left
  for h in "${hosts[@]}"; do
    left="$(ip netns pids "$(ns_of "$h")" | while read -r pid; do
              cmd="$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)"
              [[ $cmd == *sshd* ]] || echo "$pid $cmd"; done)"
    [[ -z $left ]] || fail "left running on host $h: $left"
  done
}

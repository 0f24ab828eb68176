#!/usr/bin/env bash
# An operator's path through Strata on systemd hosts, tried as a new user
# would (docs/operations.md, "A first cluster, step by step"), on real hosts
# made on this machine: three containers booted with systemd as PID 1
# (systemd-nspawn; this machine's OS on a volatile root, /etc and /usr as
# writable overlays), each in its own network namespace on a bridge with its
# own sshd. Over ssh, as the operator would:
#   1. scripts/install.sh install on every host;
#   2. strata validate the job's config and host file against the hosts;
#   3. launch.sh up --systemd: the units start on each host, as user strata,
#      under the units' sandbox;
#   4. watch it: strata status, strata top, the master's status page,
#      Prometheus scraping the hosts, systemctl on the hosts;
#   5. a worker killed with SIGKILL is restarted by systemd
#      (Restart=on-failure) and rejoins;
#   6. strata stop, then launch.sh down --systemd: the units stop, and their
#      journals, the summary and the event log come back to the run dir;
#      then a whole short job with launch.sh run --systemd, with two
#      masters elected through etcd, the leader's killed mid-job;
#   7. install.sh uninstall.
# Afterwards no container, namespace, bridge or mount is left.
BUILD_DIR="$1"
source "$(dirname "$0")/../e2e/lib.sh"
source "$(dirname "$0")/hosts_lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
[[ $(id -u) -eq 0 ]] || skip "needs root for network namespaces and containers"
command -v systemd-nspawn > /dev/null || skip "systemd-container is not installed (apt-get install systemd-container)"
[[ -x /usr/sbin/sshd && -x /lib/systemd/systemd ]] || skip "openssh-server or systemd is not installed"
[[ -f /lib/systemd/system/ssh.service ]] || skip "no ssh.service unit"

work="$(mktemp -d /tmp/strata-sd-XXXXXX)"
chmod 755 "$work"
tag="$$"
bridge="ssb$tag"
subnet=10.215.$((tag % 200 + 20))
veth="ss$tag"
hosts=(1 2 3)
ns_of() { echo "strata-sd-$tag-$1"; }
machine_of() { echo "strata-sd-$tag-$1"; }
declare -A nspawn_pid=()

cleanup() {
  set +e
  [[ -f $work/ssh/config ]] && "$ROOT/scripts/launch.sh" down --run-dir "$work/run" \
    --remote-cmd "ssh -F $work/ssh/config" > /dev/null 2>&1
  for h in "${hosts[@]}"; do
    [[ -n ${nspawn_pid[$h]:-} ]] && kill -TERM "${nspawn_pid[$h]}" 2>/dev/null
  done
  for h in "${hosts[@]}"; do
    local p="${nspawn_pid[$h]:-}"
    [[ -z $p ]] && continue
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
  done
  remove_hosts
  remove_cgroups
  pkill -KILL -f -- "$work" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# The network: a bridge here, a veth into each host's namespace.
make_hosts

# The operator's key, and root's authorized_keys on every host.
mkdir -p "$work/ssh" "$work/authorized"
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/id"
cp "$work/ssh/id.pub" "$work/authorized/authorized_keys"
chmod 700 "$work/authorized"
write_ssh_config "$work/ssh"
SSH=(ssh -F "$work/ssh/config")

# The hosts: systemd as PID 1 in each, this machine's services that would
# only get in the way masked. The source tree, the build and this test's
# files are visible at their paths (as on a shared file system).
binds=(--bind-ro="$ROOT" --bind-ro="$work")
[[ $BUILD_DIR == "$ROOT"/* ]] || binds+=(--bind-ro="$BUILD_DIR")
masks=()
for u in postgresql.service prometheus.service avahi-daemon.service avahi-daemon.socket \
         ceph.target ceph-crash.service smartmontools.service nvmf-autoconnect.service \
         nvmefc-boot-connections.service rbdmap.service getty@tty1.service user@0.service; do
  masks+=("systemd.mask=$u")
done
# Each container in a cgroup of its own (its systemd manages that subtree
# only, not this machine's nor the other containers').
cgroup_dirs() {  # cgroup_dirs NAME: NAME's directory in each hierarchy systemd uses
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then echo "/sys/fs/cgroup/$1"; return; fi
  local hier
  for hier in systemd unified; do
    [[ -f /sys/fs/cgroup/$hier/cgroup.procs ]] && echo "/sys/fs/cgroup/$hier/$1"
  done
  return 0
}
remove_cgroups() {  # what the containers left in their cgroups, deepest first
  local h d
  for h in "${hosts[@]}"; do
    for d in $(cgroup_dirs "$(machine_of "$h")"); do
      [[ -d $d ]] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
  done
  return 0
}
for h in "${hosts[@]}"; do
  (
    for d in $(cgroup_dirs "$(machine_of "$h")"); do
      mkdir -p "$d" && echo "$BASHPID" > "$d/cgroup.procs"
    done
    exec systemd-nspawn -D / --volatile=yes --overlay=/etc::/etc --overlay=/usr::/usr \
    -M "$(machine_of "$h")" --register=no --keep-unit \
    --network-namespace-path="/run/netns/$(ns_of "$h")" \
    --bind-ro="$work/authorized:/root/.ssh" "${binds[@]}" \
    -b -- systemd.firstboot=off "${masks[@]}" < /dev/null > "$work/boot-$h.log" 2>&1
  ) &
  nspawn_pid[$h]=$!
done
for h in "${hosts[@]}"; do
  up=""
  for _ in $(seq 1 120); do
    kill -0 "${nspawn_pid[$h]}" 2>/dev/null || { tail -20 "$work/boot-$h.log"; fail "host $h's container exited while booting"; }
    if "${SSH[@]}" "$(addr_of "$h")" 'systemctl is-system-running --wait > /dev/null; test -d /run/systemd/system' 2> /dev/null; then
      up=1; break
    fi
    sleep 0.5
  done
  [[ -n $up ]] || { tail -20 "$work/boot-$h.log"; fail "host $h did not boot with ssh within 60 s"; }
  [[ "$("${SSH[@]}" "$(addr_of "$h")" 'cat /proc/1/comm')" == systemd ]] || fail "PID 1 on host $h is not systemd"
done
echo "3 hosts booted with systemd as PID 1"

# 1. Install on every host.
for h in "${hosts[@]}"; do
  "${SSH[@]}" "$(addr_of "$h")" "'$ROOT/scripts/install.sh' install --bin-dir '$BUILD_DIR/bin'" \
    > "$work/install-$h.out" 2>&1 || { cat "$work/install-$h.out"; fail "install.sh install failed on host $h"; }
  "${SSH[@]}" "$(addr_of "$h")" 'id strata && systemctl cat strata-worker@.service > /dev/null' > /dev/null ||
    fail "host $h has no strata user or units after install"
done

# 2. The job and its hosts, validated against the hosts.
base=7500
# (Long enough never to end by itself: the test stops it.)
# (mTLS: launch.sh makes the certificates and installs each host's.)
TEST_SECURITY=mtls write_config "$work/job.yaml" bsp 1000 "$base" 12000
cat > "$work/hosts" <<HOSTS
# The master and a pserver on one host, a pserver and a worker on the next, a worker on the last.
$(addr_of 1) master pserver
$(addr_of 2) pserver worker
$(addr_of 3) worker=1..2
HOSTS
"$STRATA" validate --config "$work/job.yaml" --hosts "$work/hosts" --remote-cmd "${SSH[*]}" \
  > "$work/validate.out" 2>&1 || { cat "$work/validate.out"; fail "strata validate refused the hosts"; }

# 3. Up, as systemd units.
"$ROOT/scripts/launch.sh" up --systemd --config "$work/job.yaml" --hosts "$work/hosts" \
  --remote-cmd "${SSH[*]}" --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" > "$work/up.out" 2>&1 ||
  { cat "$work/up.out"; for h in "${hosts[@]}"; do "${SSH[@]}" "$(addr_of "$h")" 'journalctl -u "strata-*" --no-pager | tail -20'; done; fail "launch.sh up --systemd failed"; }
grep -q 'cluster up under systemd' "$work/up.out" || { cat "$work/up.out"; fail "up --systemd did not say so"; }
master="$(addr_of 1):$base"
# The operator's certificate, made by launch.sh (docs/security.md).
export STRATA_TLS_DIR="$work/run/tls/admin"
# Each host got its own certificates only, the keys the daemons' user's alone.
for h in "${hosts[@]}"; do
  "${SSH[@]}" "$(addr_of "$h")" 'stat -c "%n %a %U" /etc/strata/tls/*.key; test ! -e /etc/strata/tls/ca.key' \
    > "$work/keys-$h.txt" || fail "host $h: no certificates in /etc/strata/tls, or the CA's key"
  grep -qv ' 600 strata$' "$work/keys-$h.txt" && { cat "$work/keys-$h.txt"; fail "host $h: a key not 0600 strata's"; }
done
grep -q '/etc/strata/tls/master.key 600 strata' "$work/keys-1.txt" || fail "host 1 has no master key"
grep -q '/etc/strata/tls/worker.key 600 strata' "$work/keys-3.txt" || fail "host 3 has no worker key"
grep -q master "$work/keys-3.txt" && fail "host 3 got the master's key"
wait_steps "$master" 200

# 4. Watch it. Each daemon is its unit's main process, running as strata.
unit_user() {  # unit_user HOST UNIT: the user of the unit's main process
  "${SSH[@]}" "$(addr_of "$1")" "pid=\$(systemctl show -p MainPID --value $2); ps -o user= -p \$pid"
}
for hu in "1 strata-master.service" "1 strata-pserver@0.service" "2 strata-pserver@1.service" \
          "2 strata-worker@0.service" "3 strata-worker@1.service"; do
  read -r h u <<< "$hu"
  "${SSH[@]}" "$(addr_of "$h")" "systemctl is-active --quiet $u" || fail "$u is not active on host $h"
  [[ "$(unit_user "$h" "$u" | tr -d ' ')" == strata ]] || fail "$u does not run as user strata on host $h"
done
"$STRATA" status --master "$master" > "$work/status.txt" || fail "strata status failed"
[[ $(grep -cE ' alive ' "$work/status.txt") -ge 5 ]] || { cat "$work/status.txt"; fail "strata status does not show 5 alive nodes"; }
"$STRATA" top --master "$master" --iterations 1 --interval 0.5 --json > "$work/top.json" || fail "strata top failed"
python3 - "$work/top.json" <<'PY' || { cat "$work/top.json"; fail "strata top does not see the 5 daemons"; }
import json, sys
f = json.loads(open(sys.argv[1]).readline())
names = {n['name'] for n in f['nodes'] if n['up']}
assert names == {'master-0', 'pserver-0', 'pserver-1', 'worker-0', 'worker-1'}, names
PY
page="$(http_get "$(addr_of 1):$((base + 1))/?refresh=0" || true)"
grep -q '5 of 5 alive' <<< "$page" && grep -q '<svg id="chart-loss"' <<< "$page" ||
  fail "the status page does not show the 5 nodes and the charts"

# Prometheus (Debian's, on this machine) scrapes the five daemons from the
# configuration strata prometheus-config makes from the host file.
if command -v prometheus > /dev/null; then
  # (mTLS: Prometheus scrapes over https with the run's admin certificate;
  # a standing cluster gives it a viewer's: gen-certs.sh user.)
  "$STRATA" prometheus-config --config "$work/job.yaml" --hosts "$work/hosts" --interval 1s \
    --tls-dir "$STRATA_TLS_DIR" > "$work/prometheus.yml" || fail "strata prometheus-config failed"
  grep -q 'scheme: https' "$work/prometheus.yml" || fail "prometheus-config does not scrape over https"
  prom_port=$((base + 50))
  prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$prom_port" > "$work/prometheus.log" 2>&1 &
  prom_pid=$!
  python3 - "$prom_port" > "$work/prom.out" 2>&1 <<'PY' ||
import json, sys, time, urllib.parse, urllib.request
port = sys.argv[1]
def query(q):
    url = f'http://127.0.0.1:{port}/api/v1/query?' + urllib.parse.urlencode({'query': q})
    return json.load(urllib.request.urlopen(url, timeout=5))['data']['result']
deadline, last = time.time() + 30, None
while time.time() < deadline:
    try:
        up = query('up')
        sps = query('sum(strata_worker_samples_per_second)')
        last = (up, sps)
        # (The host file's room is scraped too: worker 2, down until a scale.)
        if len(up) == 6 and sum(float(x['value'][1]) == 1 for x in up) == 5 and sps and float(sps[0]['value'][1]) > 0:
            print(f"prometheus: 5 targets up on 3 hosts (and the room's 1 down), {float(sps[0]['value'][1]):.0f} samples/s")
            sys.exit(0)
    except Exception as e:
        last = e
    time.sleep(0.5)
print('prometheus never saw the 5 daemons up:', last)
sys.exit(1)
PY
    { cat "$work/prom.out"; tail -5 "$work/prometheus.log"; fail "Prometheus does not scrape the systemd cluster"; }
  cat "$work/prom.out"
  kill "$prom_pid"; wait "$prom_pid" 2>/dev/null || true
else
  echo "(Prometheus not installed: that check skipped)"
fi

# 5. systemd restarts a worker killed with SIGKILL (RestartSec=5).
pid="$("${SSH[@]}" "$(addr_of 3)" 'systemctl show -p MainPID --value strata-worker@1.service')"
"${SSH[@]}" "$(addr_of 3)" "kill -KILL $pid"
restarted=""
for _ in $(seq 1 60); do
  n="$("${SSH[@]}" "$(addr_of 3)" 'systemctl show -p NRestarts --value strata-worker@1.service')"
  if (( n >= 1 )) && "${SSH[@]}" "$(addr_of 3)" 'systemctl is-active --quiet strata-worker@1.service'; then
    restarted=1; break
  fi
  sleep 0.5
done
[[ -n $restarted ]] || fail "systemd did not restart the killed worker"
for _ in $(seq 1 100); do  # it registers again as a new node
  "$STRATA" status --master "$master" --json > "$work/status.json"
  python3 - "$work/status.json" <<'PY' && break
import json, sys
m = json.load(open(sys.argv[1]))['view']['members']
w1 = [n for n in m if n['role'] == 'WORKER' and n.get('index', 0) == 1]
sys.exit(0 if len(w1) >= 2 and w1[-1]['state'] == 'ALIVE' else 1)
PY
  sleep 0.2
done
python3 - "$work/status.json" <<'PY' || fail "the restarted worker did not rejoin"
import json, sys
m = json.load(open(sys.argv[1]))['view']['members']
w1 = [n for n in m if n['role'] == 'WORKER' and n.get('index', 0) == 1]
assert len(w1) >= 2 and w1[-1]['state'] == 'ALIVE', w1
PY

# 5b. strata scale through the master's own provider: a worker unit started
# on host 3 (the host file's room), over ssh with the key launch.sh gave it,
# then drained away and its unit stopped.
out="$("$STRATA" scale --master "$master" --workers 3 --reason systemd-grow 2>&1)" ||
  { echo "$out"; "${SSH[@]}" "$(addr_of 1)" 'journalctl -u strata-master --no-pager | grep -E "provider|scale" | tail -20'
    fail "strata scale --workers 3 under systemd failed"; }
grep -qE 'scale done \(workers 2 -> 3: starting worker 2\)' <<< "$out" || fail "scale to 3 not done: $out"
"${SSH[@]}" "$(addr_of 3)" 'systemctl is-active --quiet strata-worker@2.service' ||
  fail "the provider did not start strata-worker@2 on host 3"
[[ "$(unit_user 3 strata-worker@2.service | tr -d ' ')" == strata ]] || fail "strata-worker@2 does not run as strata"
"${SSH[@]}" "$(addr_of 1)" 'journalctl -u strata-master --no-pager' > "$work/master-journal.txt"
grep -q "strata provider: $(addr_of 3): started strata-worker@2.service" "$work/master-journal.txt" ||
  { grep -E 'provider|scale' "$work/master-journal.txt" | tail; fail "the master's journal does not show the provider's start"; }
# The key does nothing else: a shell command over it is refused.
"${SSH[@]}" "$(addr_of 1)" "ssh -i /etc/strata/provider/id -o IdentitiesOnly=yes -o BatchMode=yes \
    -o UserKnownHostsFile=/etc/strata/provider/known_hosts root@$(addr_of 2) id" > "$work/key.out" 2>&1 &&
  fail "the provider's key ran a shell command: $(cat "$work/key.out")"
grep -q "refused 'id'" "$work/key.out" || fail "the provider's key: $(cat "$work/key.out")"
out="$("$STRATA" scale --master "$master" --workers 2 --reason systemd-shrink 2>&1)" ||
  { echo "$out"; fail "strata scale --workers 2 under systemd failed"; }
grep -q 'scale done' <<< "$out" || fail "scale to 2 not done: $out"
for _ in $(seq 1 100); do
  "${SSH[@]}" "$(addr_of 3)" 'systemctl is-active --quiet strata-worker@2.service' || break
  sleep 0.2
done
"${SSH[@]}" "$(addr_of 3)" 'systemctl is-active --quiet strata-worker@2.service' &&
  fail "strata-worker@2 still runs after the scale back to 2"
echo "strata scale under systemd: strata-worker@2 started on host 3 by the master's provider, then drained and stopped"

# 6. Stop the job, then the units.
"$STRATA" stop --master "$master" --no-checkpoint > "$work/stop.out" || { cat "$work/stop.out"; fail "strata stop failed"; }
"$ROOT/scripts/launch.sh" down --run-dir "$work/run" --remote-cmd "${SSH[*]}" > "$work/down.out" 2>&1 ||
  { cat "$work/down.out"; fail "launch.sh down failed"; }
for hu in "1 strata-master.service" "1 strata-pserver@0.service" "2 strata-pserver@1.service" \
          "2 strata-worker@0.service" "3 strata-worker@1.service"; do
  read -r h u <<< "$hu"
  "${SSH[@]}" "$(addr_of "$h")" "systemctl is-active --quiet $u" && fail "$u still active on host $h after down"
done
[[ "$(json_field "$work/run/summary.json" state)" == stopped ]] ||
  { cat "$work/run/summary.json" 2>/dev/null; fail "the summary did not come back, or the job is not stopped"; }
grep -q '"kind": "node_dead"' "$work/run/events.jsonl" || fail "the event log did not come back with the worker's death"
grep -q 'registered as node' "$work/run/logs/master-0.log" || fail "the master's journal did not come back"
grep -q 'control plane: mTLS, certificate /etc/strata/tls/master.crt' "$work/run/logs/master-0.log" ||
  fail "the master did not run with mTLS"
"$STRATA" audit verify --file "$work/run/audit.jsonl" > /dev/null || fail "the audit log did not come back intact"
grep -q "\"who\": \"admin:admin\", \"from\": \"ipv4:$subnet.1:[0-9]*\", \"action\": \"stop\"" "$work/run/audit.jsonl" ||
  fail "the audit log does not name the operator's stop"
grep -q 'progress: worker 1' "$work/run/logs/worker-1.log" || fail "worker 1's journal did not come back"

# A whole job with run --systemd: up, its progress, the summary, down. Its
# masters are two, on hosts 1 and 2, a leader and a standby elected
# through an etcd on this machine (docs/reliability.md, "Master high
# availability"): the leader's master is killed mid-job, the standby
# leads, systemd restarts the killed one (as a standby) and the job
# succeeds.
etcd_port=$((base + 60))
[[ -x /usr/bin/etcd ]] || fail "no /usr/bin/etcd: scripts/install-deps.sh --test installs etcd-server"
/usr/bin/etcd --name sd --data-dir "$work/etcd" \
  --listen-client-urls "http://$subnet.1:$etcd_port" --advertise-client-urls "http://$subnet.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
  --initial-cluster "sd=http://127.0.0.1:$((etcd_port + 1))" > "$work/etcd.log" 2>&1 &
etcd_pid=$!
# (Long enough that the kill comes mid-job: 60 epochs of 12000 records,
# about 10 s.)
TEST_SECURITY=mtls write_config "$work/short.yaml" bsp 60 "$base" 12000
sed -i "s|^cluster:\$|cluster:\n  etcd:\n    endpoints: [$subnet.1:$etcd_port]|" "$work/short.yaml"
grep -q '^  etcd:$' "$work/short.yaml" || fail "no etcd section in the config"
cat > "$work/hosts-ha" <<HOSTS
$(addr_of 1) master pserver
$(addr_of 2) master pserver worker
$(addr_of 3) worker=1..2
HOSTS
masters="$(addr_of 1):$base,$(addr_of 2):$base"
"$ROOT/scripts/launch.sh" run --systemd --config "$work/short.yaml" --hosts "$work/hosts-ha" \
  --remote-cmd "${SSH[*]}" --run-dir "$work/run2" --bin-dir "$BUILD_DIR/bin" --timeout 300 \
  > "$work/run2.out" 2>&1 &
launcher=$!
ha_why() {  # what the launcher and the masters said
  tail -n 20 "$work/run2.out"
  for h in 1 2; do
    echo "--- host $h's master:"
    "${SSH[@]}" "$(addr_of "$h")" 'journalctl -u strata-master --no-pager | tail -n 15'
  done
  tail -n 5 "$work/etcd.log"
}
# (The CLI with this run's admin certificate, once launch.sh made it.)
for _ in $(seq 1 300); do
  [[ -f "$work/run2/tls/admin/client.crt" ]] && break
  sleep 0.1
done
export STRATA_TLS_DIR="$work/run2/tls/admin"
for _ in $(seq 1 600); do
  s="$(steps_of "$masters")"
  [[ -n "$s" && "$s" -ge 300 ]] && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
[[ -n "$s" && "$s" -ge 300 ]] || { ha_why; fail "the job with two masters did not reach step 300"; }
leads() {  # leads HOST: whether host H's master journal says it leads
  "${SSH[@]}" "$(addr_of "$1")" "journalctl -u strata-master --no-pager | grep -q 'this master leads'"
}
leader=""
for h in 1 2; do leads "$h" && leader="$h"; done
[[ -n $leader ]] || { ha_why; fail "neither master's journal says it leads"; }
other=$(( leader == 1 ? 2 : 1 ))
"${SSH[@]}" "$(addr_of "$leader")" 'systemctl kill -s KILL strata-master.service'
for _ in $(seq 1 200); do leads "$other" && break; sleep 0.1; done
leads "$other" || { ha_why; fail "the standby on host $other did not lead within 20 s of the leader's kill"; }
restarted=""
for _ in $(seq 1 100); do
  if "${SSH[@]}" "$(addr_of "$leader")" \
       "journalctl -u strata-master --no-pager | grep -q 'standby: the leading master is'"; then
    restarted=1; break
  fi
  sleep 0.2
done
[[ -n $restarted ]] || fail "systemd's restart of the killed master on host $leader is not a standby"
set +e; wait "$launcher"; rc=$?; set -e
(( rc == 0 )) || { ha_why; fail "launch.sh run --systemd exited $rc"; }
grep -q '^progress: epoch ' "$work/run2.out" || { cat "$work/run2.out"; fail "run --systemd showed no progress"; }
grep -q 'launch.sh: job succeeded' "$work/run2.out" || { cat "$work/run2.out"; fail "run --systemd did not succeed"; }
[[ "$(json_field "$work/run2/summary.json" state)" == succeeded ]] || fail "run --systemd: no summary"
grep -q 'state of epoch [0-9]* replayed from etcd' "$work/run2/summary.json" ||
  fail "the new leader did not carry on from the state in etcd: $(cat "$work/run2/summary.json")"
for h in 1 2; do
  "${SSH[@]}" "$(addr_of "$h")" 'systemctl is-active --quiet strata-master.service' &&
    fail "run --systemd left the master running on host $h"
done
"${SSH[@]}" "$(addr_of 2)" 'systemctl is-active --quiet strata-worker@0.service' && fail "run --systemd left units running"
[[ -s "$work/run2/logs/master-0.log" && -s "$work/run2/logs/master-1.log" ]] ||
  fail "the masters' journals did not come back"
kill "$etcd_pid" 2>/dev/null || true
wait "$etcd_pid" 2>/dev/null || true
echo "run --systemd with two masters: the leader on host $leader killed, host $other's master led, the job succeeded"

# 7. Uninstall.
for h in "${hosts[@]}"; do
  "${SSH[@]}" "$(addr_of "$h")" "'$ROOT/scripts/install.sh' uninstall" > /dev/null 2>&1 || fail "uninstall failed on host $h"
  "${SSH[@]}" "$(addr_of "$h")" 'test ! -e /etc/systemd/system/strata-master.service && test ! -e /usr/local/bin/strata-worker' ||
    fail "uninstall left units or binaries on host $h"
done

# Nothing left: the containers powered off, then no namespace, bridge or mount.
for h in "${hosts[@]}"; do "${SSH[@]}" -O exit "$(addr_of "$h")" > /dev/null 2>&1 || true; done
for h in "${hosts[@]}"; do kill -TERM "${nspawn_pid[$h]}"; done
for h in "${hosts[@]}"; do
  for _ in $(seq 1 150); do kill -0 "${nspawn_pid[$h]}" 2>/dev/null || break; sleep 0.1; done
  kill -0 "${nspawn_pid[$h]}" 2>/dev/null &&
    { tail -n 15 "$work/boot-$h.log" | cut -c1-160; fail "host $h's container did not power off within 15 s"; }
  wait "${nspawn_pid[$h]}" 2>/dev/null || true
  nspawn_pid[$h]=""
  left="$(ip netns pids "$(ns_of "$h")")"
  [[ -z $left ]] || fail "processes left in host $h's namespace: $left"
  ip netns del "$(ns_of "$h")"
done
ip link del "$bridge"
remove_cgroups
for h in "${hosts[@]}"; do
  for d in $(cgroup_dirs "$(machine_of "$h")"); do
    [[ -d $d ]] && fail "cgroup $d left"
  done
done
grep -q "strata-sd-$tag-" /proc/self/mountinfo && fail "mounts left: $(grep "strata-sd-$tag-" /proc/self/mountinfo)"
assert_nothing_left "$work"
echo "PASS: install, validate, up --systemd on 3 systemd hosts, top/status/page, systemd restart, strata scale through the provider, stop, down, run --systemd with a master failover, uninstall"

#!/usr/bin/env bash
# Master high availability (docs/reliability.md, "Master high
# availability"): two masters on hosts of their own (network namespaces
# joined by a bridge), a real 3-member etcd (one member on each master's
# host, one on the pservers'), 3 pservers and 2 workers on two more hosts;
# a bsp job, each fault against the fault-free run's accuracy.
#   kill    the leader's host dies (its processes SIGKILLed, its namespace
#           deleted; its etcd member with it): the standby leads within
#           10 s, every node follows it, bsp goes on, nothing acknowledged
#           is lost; the old host brought back runs its master as a
#           standby.
#   cut     the leader's host is cut off (link down), not killed: it stops
#           acting before the new leader is elected (their logs' times,
#           and the etcd revisions: its last state write is older than the
#           new leader's key); healed, it finds it lost the lead and its
#           restart is a standby.
#   quorum  etcd loses its quorum (2 of 3 members stopped) for a few
#           seconds: the leader pauses, the job stalls cleanly, then goes
#           on once etcd is back: under the same leader when its lease
#           outlived the outage, else under the other (etcd revokes an
#           expired lease as soon as it has a quorum again).
# And the bad configs: two masters without cluster.etcd, and an etcd that
# cannot be reached, refused at start with a clear message.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
command -v ip > /dev/null || skip "no ip(8) (iproute2) to make network namespaces"
[[ -x /usr/bin/etcd ]] || fail "no /usr/bin/etcd: scripts/install-deps.sh --test installs etcd-server"

tag="sf$$"
net=$(( 100 + RANDOM % 100 ))
br="${tag}br"
declare -A NS=([10]=m0 [11]=m1 [20]=p [30]=w)
ip_of() { echo "10.$net.0.$1"; }
cleanup_net() {
  set +e
  for h in "${!NS[@]}"; do
    ip netns pids "$tag-${NS[$h]}" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
    ip netns del "$tag-${NS[$h]}" 2>/dev/null
  done
  ip link del "$br" 2>/dev/null
  true
}
trap 'r=$?; set +e; pkill -CONT -f -- "$WORK/etcd" 2>/dev/null; cleanup_net; cleanup_fault "$r"' EXIT
if ! ip link add "$br" type bridge 2>/dev/null; then
  skip "cannot make network namespaces here (ip link add: not permitted)"
fi
ip link set "$br" up
ip addr add "10.$net.0.1/24" dev "$br"
# make_host H: the namespace of host 10.N.0.H on the bridge.
make_host() {
  local h="$1" ns="$tag-${NS[$1]}"
  ip netns add "$ns"
  ip link add "$tag${NS[$h]}" type veth peer name eth0 netns "$ns"
  ip link set "$tag${NS[$h]}" master "$br" up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip addr add "$(ip_of "$h")/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
}
for h in "${!NS[@]}"; do make_host "$h"; done
cat > "$WORK/nsexec" <<SH
#!/usr/bin/env bash
h="\${1##*.}"; shift
declare -A NS=([10]=m0 [11]=m1 [20]=p [30]=w)
exec ip netns exec "$tag-\${NS[\$h]}" bash -c "\$*"
SH
chmod +x "$WORK/nsexec"
export STRATA_REMOTE_CMD="$WORK/nsexec"

# The etcd cluster: a member on each master's host and one on the
# pservers' host.
ETCD_HOSTS=(10 11 20)
members=""
for h in "${ETCD_HOSTS[@]}"; do members+="${members:+,}e$h=http://$(ip_of "$h"):2380"; done
# start_etcd H: host H's member (its data kept in $WORK/etcd-H).
start_etcd() {
  local h="$1" a; a="$(ip_of "$1")"
  ip netns exec "$tag-${NS[$h]}" /usr/bin/etcd --name "e$h" --data-dir "$WORK/etcd-$h" \
    --listen-client-urls "http://$a:2379" --advertise-client-urls "http://$a:2379" \
    --listen-peer-urls "http://$a:2380" --initial-advertise-peer-urls "http://$a:2380" \
    --initial-cluster "$members" --initial-cluster-state new --initial-cluster-token "$tag" \
    > "$WORK/etcd-$h.log" 2>&1 &
  disown
  echo $! > "$WORK/etcd-$h.pid"
}
for h in "${ETCD_HOSTS[@]}"; do start_etcd "$h"; done
endpoints="$(ip_of 10):2379,$(ip_of 11):2379,$(ip_of 20):2379"
etcdctl_() { ETCDCTL_API=3 ip netns exec "$tag-w" etcdctl --endpoints "$endpoints" "$@"; }
for _ in $(seq 1 100); do
  etcdctl_ endpoint health > /dev/null 2>&1 && break
  sleep 0.1
done
etcdctl_ endpoint health > /dev/null 2>&1 || fail "the etcd cluster did not come up: $(tail -3 "$WORK"/etcd-10.log)"

fault_config 1 6
sed -i "s|^  replication: 1\$|  replication: 1\n  etcd:\n    endpoints: [$(ip_of 10):2379, $(ip_of 11):2379, $(ip_of 20):2379]|" "$WORK/job.yaml"
grep -q '^  etcd:$' "$WORK/job.yaml" || fail "no etcd section in the config"
printf '%s master\n%s master\n%s pserver=3\n%s worker=2\n' \
  "$(ip_of 10)" "$(ip_of 11)" "$(ip_of 20)" "$(ip_of 30)" > "$WORK/hosts"
# The leader serves the status page; a standby redirects it there (307),
# followed here.
master_status() {
  curl -sfL -m 1 "http://$(ip_of 10):$((BASE + 1))/status" ||
    curl -sfL -m 1 "http://$(ip_of 11):$((BASE + 1))/status"
}
# serves_status H: whether host H's master serves the status page itself
# (200: it leads).
serves_status() {
  [[ "$(curl -s -m 1 -o /dev/null -w '%{http_code}' "http://$(ip_of "$1"):$((BASE + 1))/status")" == 200 ]]
}
# leader_host: 10 or 11, whichever serves its status page ("" if neither).
leader_host() {
  local h
  for h in 10 11; do
    serves_status "$h" && { echo "$h"; return; }
  done
}
# log_time FILE PATTERN: the time (s since the epoch) of the first line
# matching PATTERN in a daemon's log.
log_time() {
  python3 - "$1" "$2" <<'PY'
import datetime, re, sys
for line in open(sys.argv[1], errors="replace"):
    if re.search(sys.argv[2], line):
        m = re.match(r"[IWEF](\d{8}) (\d\d:\d\d:\d\d\.\d+)", line)
        print(datetime.datetime.strptime(m.group(1) + " " + m.group(2), "%Y%m%d %H:%M:%S.%f").timestamp())
        break
PY
}
# check_run NAME: the job succeeded with every task, nothing acknowledged
# lost, no node declared dead or failed, within 1% of the fault-free
# accuracy.
check_run() {
  local s; s="$(summary "$1")"
  [[ "$(summary_field "$1" tasks_done)" == "$(summary_field "$1" tasks_total)" ]] || fail "$1: data tasks lost"
  [[ "$(ledger_field "$1" lost)" == 0 ]] || fail "$1: acknowledged updates lost: $(cat "$s")"
  grep -q 'declared dead' "$s" && fail "$1: nodes were declared dead across the failover: $(cat "$s")"
  # Every node followed the new leader: none failed on the way.
  grep -E '(pserver|worker)-[0-9]+ failed' "$WORK/$1.out" &&
    fail "$1: nodes failed across the failover: $(grep -E 'failed' "$WORK/$1.out")"
  assert_accuracy_close "$1" base
}

# --- Bad configs, refused at start.
rc=0
sed '/^  etcd:$/,/^    endpoints:/d' "$WORK/job.yaml" > "$WORK/no-etcd.yaml"
"$BUILD_DIR/bin/strata-master" --config "$WORK/no-etcd.yaml" --hosts "$WORK/hosts" --port 0 \
  --http_port -1 > "$WORK/no-etcd.log" 2>&1 || rc=$?
(( rc == 2 )) || fail "two masters without cluster.etcd: the master exited $rc"
grep -q "2 masters (lines 1, 2) but the config has no cluster.etcd.endpoints" "$WORK/no-etcd.log" ||
  fail "two masters without cluster.etcd: no clear message: $(tail -2 "$WORK/no-etcd.log")"
sed "s|^    endpoints: .*|    endpoints: [127.0.0.1:1, 127.0.0.1:2]|" "$WORK/job.yaml" > "$WORK/far-etcd.yaml"
rc=0
"$BUILD_DIR/bin/strata-master" --config "$WORK/far-etcd.yaml" --hosts "$WORK/hosts" --port 0 \
  --host "$(ip_of 10)" --http_port -1 > "$WORK/far-etcd.log" 2>&1 || rc=$?
(( rc == 2 )) || fail "an unreachable etcd: the master exited $rc"
grep -q "etcd (cluster.etcd.endpoints) cannot be reached: 127.0.0.1:1: .*127.0.0.1:2: " "$WORK/far-etcd.log" ||
  fail "an unreachable etcd: no clear message: $(tail -2 "$WORK/far-etcd.log")"
rc=0
"$BUILD_DIR/bin/strata-master" --config "$WORK/job.yaml" --hosts "$WORK/hosts" --host 10.254.0.9 \
  --port 0 --http_port -1 > "$WORK/other-host.log" 2>&1 || rc=$?
(( rc == 2 )) || fail "a master on none of the host file's master hosts: it exited $rc"
grep -q -- "--host 10.254.0.9 is not one of them: $WORK/hosts lists several masters ($(ip_of 10), $(ip_of 11))" "$WORK/other-host.log" ||
  fail "a master on none of the host file's master hosts: no clear message: $(tail -2 "$WORK/other-host.log")"
rc=0
"$BUILD_DIR/bin/strata-master" --config "$WORK/job.yaml" --hosts "$WORK/hosts" \
  --port 0 --http_port -1 > "$WORK/no-host.log" 2>&1 || rc=$?
(( rc == 2 )) || fail "one of several masters without --host: it exited $rc"
grep -q -- "no --host given: .* STRATA_MASTER_HOST" "$WORK/no-host.log" ||
  fail "one of several masters without --host: no clear message: $(tail -2 "$WORK/no-host.log")"
echo "bad configs refused: two masters without etcd, an unreachable etcd, a master host not in the host file or none given"

# --- kill: the leader's host dies mid-job.
baseline_then_start kill 30000
old="$(leader_host)"; [[ -n "$old" ]] || fail "kill: no master serves its status"
new=$(( old == 10 ? 11 : 10 ))
t0="$(now)"
ip netns pids "$tag-${NS[$old]}" | xargs -r kill -KILL
ip netns del "$tag-${NS[$old]}"
back=""
for _ in $(seq 1 200); do  # 20 s at most
  if serves_status "$new"; then back="$(now)"; break; fi
  sleep 0.1
done
[[ -n "$back" ]] || fail "kill: the standby did not lead within 20 s$(printf '\n'; why kill)"
takeover="$(secs "$t0" "$back")"
python3 -c "import sys; sys.exit(0 if $takeover <= 10 else 1)" ||
  fail "kill: the standby led $takeover s after the leader's host died (more than 10 s)"
# etcd lost a member with the host: the job goes on.
expect_training_goes_on kill "kill: training did not go on under the new leader"
# The old host comes back: its etcd member rejoins, and its master (as
# launch.sh started it) is a standby.
make_host "$old"
start_etcd "$old"
read -r _h cmd < <(sed -n 2p "$WORK/run-kill/cmd/master-$(( old == 10 ? 0 : 1 ))" | sed 's/^/x /')
"$WORK/nsexec" "$(ip_of "$old")" "$cmd > '$WORK/returned.log' 2>&1" &
returned=$!
for _ in $(seq 1 100); do
  grep -q "standby: the leading master is $(ip_of "$new")" "$WORK/returned.log" 2>/dev/null && break
  sleep 0.1
done
grep -q "standby: the leading master is $(ip_of "$new")" "$WORK/returned.log" ||
  fail "kill: the old leader, back, is not a standby: $(tail -3 "$WORK/returned.log")"
# Its HTTP port sends the leader's pages to the leader's.
loc="$(curl -s -m 1 -o /dev/null -w '%{http_code} %{redirect_url}' "http://$(ip_of "$old"):$((BASE + 1))/status?x=1" || true)"
[[ "$loc" == "307 http://$(ip_of "$new"):$((BASE + 1))/status?x=1" ]] ||
  fail "kill: the standby's status page is not a redirect to the leader's: '$loc'"
# strata status on the list says which master leads.
roles="$("$STRATA" status --master "$(ip_of "$old"):$BASE,$(ip_of "$new"):$BASE" | grep '^  masters: ' || true)"
[[ "$roles" == "  masters: $(ip_of "$old"):$BASE standby, $(ip_of "$new"):$BASE leads" ]] ||
  fail "kill: strata status does not say which master leads: '$roles'"
wait_job || fail "kill: the job failed: $(why kill)"
pkill -KILL -f -- "strata-master .*--host $(ip_of "$old") " 2>/dev/null
wait "$returned" 2>/dev/null || true
check_run kill
grep -q 'master restarted (restart 1): state of epoch [0-9]* replayed from etcd' "$(summary kill)" ||
  fail "kill: the new leader did not carry on from the state in etcd: $(cat "$(summary kill)")"
lead_t="$(log_time "$WORK/run-kill/logs/master-$(( new == 10 ? 0 : 1 )).log" 'this master leads')"
echo "kill: the standby led $(secs "$t0" "$lead_t") s after the leader's host died (its status page" \
  "$takeover s); ledger: $(ledger_field kill acked) acknowledged, 0 lost"
throughput kill "$back"

# --- cut: the leader's host cut off, not killed. (The old host, back, keeps
# its etcd member.)
start_job cut
wait_for_samples cut 30000
cut="$(leader_host)"; [[ -n "$cut" ]] || fail "cut: no master serves its status"
other=$(( cut == 10 ? 11 : 10 ))
cut_log="$WORK/run-cut/logs/master-$(( cut == 10 ? 0 : 1 )).log"
other_log="$WORK/run-cut/logs/master-$(( other == 10 ? 0 : 1 )).log"
t0="$(now)"
ip -n "$tag-${NS[$cut]}" link set eth0 down
for _ in $(seq 1 200); do
  grep -q 'this master leads' "$other_log" && break
  sleep 0.1
done
grep -q 'this master leads' "$other_log" || fail "cut: the other master did not lead within 20 s$(printf '\n'; why cut)"
expect_training_goes_on cut "cut: training did not go on under the new leader"
ip -n "$tag-${NS[$cut]}" link set eth0 up
wait_job || fail "cut: the job failed: $(why cut)"
check_run cut
# The cut-off leader stopped acting before the other was elected, and no
# state write of it is newer than the new leader's key.
stopped_t="$(log_time "$cut_log" 'this master stops acting as the leader')"
[[ -n "$stopped_t" ]] || fail "cut: the cut-off leader did not stop acting: $(grep -E '^[EW]' "$cut_log" | tail -3)"
elected_t="$(log_time "$other_log" 'this master leads')"
python3 -c "import sys; sys.exit(0 if $stopped_t < $elected_t else 1)" ||
  fail "cut: the cut-off leader stopped at $stopped_t, after the new leader was elected at $elected_t"
last_write="$(sed -n 's/.*this master stops acting as the leader.*its last state write: etcd revision \([0-9]*\)).*/\1/p' "$cut_log" | head -n 1)"
elected_rev="$(sed -n 's/.*this master leads: .* (revision \([0-9]*\), lease.*/\1/p' "$other_log" | tail -n 1)"
[[ -n "$last_write" && -n "$elected_rev" ]] || fail "cut: no revisions in the logs"
(( last_write < elected_rev )) ||
  fail "cut: the old leader's last state write (revision $last_write) is not older than the new leader's election (revision $elected_rev)"
grep -q 'this master no longer leads' "$cut_log" ||
  fail "cut: the old leader, healed, did not find it lost the lead: $(grep -E '^[EW]' "$cut_log" | tail -3)"
grep -q "standby: the leading master is $(ip_of "$other")" "$cut_log" ||
  fail "cut: the old leader's restart is not a standby: $(tail -3 "$cut_log")"
echo "cut: the cut-off leader stopped acting $(secs "$t0" "$stopped_t") s after the cut, the other" \
  "was elected $(secs "$t0" "$elected_t") s after it; the old leader's last state write: etcd" \
  "revision $last_write, the new leader's key: revision $elected_rev"

# --- quorum: etcd loses its quorum for a while.
start_job quorum
wait_for_samples quorum 30000
q="$(leader_host)"; [[ -n "$q" ]] || fail "quorum: no master serves its status"
q_log="$WORK/run-quorum/logs/master-$(( q == 10 ? 0 : 1 )).log"
stopped=()
for h in "${ETCD_HOSTS[@]}"; do
  [[ "$h" == "$q" ]] && continue
  kill -STOP "$(cat "$WORK/etcd-$h.pid")"; stopped+=("$h")
done
for _ in $(seq 1 100); do
  grep -q 'master paused' "$q_log" && break
  sleep 0.1
done
grep -q 'master paused' "$q_log" || fail "quorum: the leader did not pause without a quorum$(printf '\n'; why quorum)"
a="$(job_samples 2>/dev/null || echo 0)"
sleep 3
for h in "${stopped[@]}"; do kill -CONT "$(cat "$WORK/etcd-$h.pid")"; done
# Then a master leads again: the same one when its lease outlived the
# outage, else (etcd revoked the lease once it had its quorum back) the
# other, elected, carrying on from the state in etcd.
other_q_log="$WORK/run-quorum/logs/master-$(( q == 10 ? 1 : 0 )).log"
how=""
for _ in $(seq 1 300); do
  if grep -q 'acting as the leader again' "$q_log"; then how=resumed; break; fi
  if grep -q 'this master leads' "$other_q_log"; then how=elected; break; fi
  sleep 0.1
done
[[ -n "$how" ]] || fail "quorum: no master led again within 30 s of etcd's quorum coming back$(printf '\n'; why quorum)"
expect_training_goes_on quorum "quorum: training did not go on after etcd came back"
wait_job || fail "quorum: the job failed: $(why quorum)"
check_run quorum
if [[ $how == resumed ]]; then
  grep -q 'master resumed' "$(summary quorum)" || fail "quorum: no resume event"
  echo "quorum: etcd without a quorum for 3 s: the leader paused, then went on as the leader"
else
  grep -q 'this master no longer leads' "$q_log" || fail "quorum: two leaders: the old one did not stop"
  echo "quorum: etcd without a quorum for 3 s: the leader paused; etcd ended its lease once back," \
    "and the other master led on from the state in etcd"
fi
for h in "${ETCD_HOSTS[@]}"; do kill -KILL "$(cat "$WORK/etcd-$h.pid")" 2>/dev/null || true; done
sleep 0.5
assert_nothing_left "$WORK"

#!/usr/bin/env bash
# Live partition migration under fire (docs/reliability.md, "Moving
# partitions"): a bsp job with replication 1 grows from 2 to 3 pservers,
# one move at a time, each held 1.5 s in the middle (the failpoint
# pserver.move.copy_received~1500: the target holds the copy it received
# before taking it in, and the source waits for its answer; held longer
# than the replication ack timeout, dead_timeout_ms/2 = 2 s here, the
# target would be reported unreachable). The new pserver is SIGKILLed while it receives a
# partition (the move is abandoned; its supervisor restarts it and the
# moves go to the new instance), then a source pserver while it sends one (its partitions
# fail over to their backups; the move is abandoned and planned again). The
# scale still completes, the job finishes with the fault-free run's
# accuracy and the update ledger says no acknowledged push was lost.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
fault_config 1 6 $'elastic:\n  max_pservers: 3\n  max_moves: 1'
sed -i 's/^  dead_timeout_ms: 2000$/  dead_timeout_ms: 4000/' "$WORK/job.yaml"
grep -q '^  dead_timeout_ms: 4000$' "$WORK/job.yaml" || fail "no dead_timeout_ms to change"
printf '127.0.0.1 master pserver=2..3 worker=2\n' > "$WORK/hosts"
run_job base || fail "the fault-free run failed: $(tail -5 "$WORK/base.out")"
STRATA_PSERVER_FLAGS="--failpoint=pserver.move.copy_received~1500" start_job moves
wait_for_samples moves 40000
master="127.0.0.1:$BASE"
events="$WORK/run-moves/events.jsonl"
# joined INDEX: the node id pserver INDEX last joined as (its events: no
# status call, which a loaded machine makes slow), 0 if none.
joined() {
  local n
  n="$(grep -o "\"pserver $1 joined as node [0-9]*" "$events" 2>/dev/null | tail -1)"
  echo "${n##* }" | grep -E '^[0-9]+$' || echo 0
}
# node_id ROLE INDEX: the id of the newest node of that role and index.
node_id() {
  master_status 2>/dev/null | python3 -c "import json,sys
try: v=json.load(sys.stdin)['view']['members']
except Exception: v=[]
m=[x for x in v if x['role']=='$1' and x.get('index',0)==$2]
print(max(int(x['id']) for x in m) if m else 0)"
}
# wait_move FROM|* TO|* [primary]: a move in flight (a 'moving' event
# with no 'moved' or 'move_abandoned' for it yet) from node FROM to node TO
# ('*': any), of a primary if asked (a backup's copy comes from the
# primary, not from the node it moves from); prints "FROM TO" of the first.
wait_move() {
  local from="$1" to="$2" primary="${3:-}"
  for _ in $(seq 1 1200); do  # 60 s at most (a restart under a loaded CI machine)
    local hit
    hit="$(python3 -c "
import json, re, sys
flight = {}  # (partition, from, to) -> a backup's move
for line in sys.stdin:
    try: e = json.loads(line)
    except ValueError: continue  # (a line being written)
    m = e['message']
    if e['kind'] in ('moving', 'moved'):
        for p, backup, a, b in re.findall(r'(\d+) (\(backup\) )?node (\d+) -> (\d+)', m):
            if e['kind'] == 'moving': flight[(p, a, b)] = bool(backup)
            else: flight.pop((p, a, b), None)
    elif e['kind'] == 'move_abandoned':
        g = re.search(r'partition (\d+) from node (\d+) to node (\d+)', m)
        if g: flight.pop(g.groups(), None)
for (p, a, b), backup in flight.items():
    if '$from' in ('*', a) and '$to' in ('*', b) and not (backup and '$primary'):
        print(a, b); sys.exit(0)
" 2>/dev/null < "$events")"
    [[ -n "$hit" ]] && { echo "$hit"; return 0; }
    sleep 0.05
  done
  return 1
}

p0="$(node_id PSERVER 0)"
p1="$(node_id PSERVER 1)"
(( p0 > 0 && p1 > 0 )) || fail "pservers 0 and 1 not in the view"
"$STRATA" scale --master "$master" --pservers 3 --no-wait > "$WORK/scale.out" ||
  fail "scale to 3 pservers refused: $(cat "$WORK/scale.out")"
for _ in $(seq 1 200); do
  target="$(joined 2)"
  (( target > 0 )) && break
  sleep 0.05
done
(( target > 0 )) || fail "pserver 2 did not register"
# 1. The target killed while it receives a partition.
read -r from to <<< "$(wait_move '*' "$target")" || true
[[ -n $from ]] || fail "no move to pserver 2 (node $target): $(grep -E 'mov|scale|dead|join' "$events" | tail -12)"
kill -KILL "$(pid_of moves pserver-2)"
echo "killed pserver 2 (node $target) receiving from node $from"
# wait_event TEXT WHAT: until the events hold TEXT (20 s at most).
wait_event() {
  for _ in $(seq 1 400); do
    grep -q "$1" "$events" && return 0
    sleep 0.05
  done
  fail "$2: $(grep -E "mov|dead|abandon" "$events" | tail -12)"
}
wait_event "to node $target abandoned: node $target left" "the move to the killed pserver was not abandoned"
# 2. A source killed while it sends one (to the restarted pserver 2; its
# node id is new, so every move to it counts: its first move may be
# written with the abandonment above).
for _ in $(seq 1 400); do
  t2="$(joined 2)"
  (( t2 != target )) && break
  sleep 0.05
done
(( t2 != target )) || fail "pserver 2 was not restarted"
read -r from to <<< "$(wait_move '*' "$t2" primary)" || true
[[ -n $from ]] || fail "no move to the restarted pserver 2 (node $t2): $(grep -E 'mov|scale|dead|join' "$events" | tail -12)"
# (The source is one of the pservers the job started with: no status
# call between the move seen and the kill.)
case "$from" in
  "$p0") src_index=0 ;;
  "$p1") src_index=1 ;;
  *) fail "the move to node $t2 comes from node $from, not pserver 0 (node $p0) or 1 (node $p1)" ;;
esac
kill -KILL "$(pid_of moves "pserver-$src_index")"
echo "killed pserver $src_index (node $from) sending to node $t2"
wait_event "from node $from to node $t2 abandoned: node $from left" \
  "the move from the killed pserver was not abandoned"
# The scale still completes: the moves go on with the pservers there are.
for _ in $(seq 1 1200); do  # 60 s at most
  grep -q '"kind": "scale_done"' "$events" && break
  grep -q '"kind": "scale_failed"' "$events" && fail "the scale failed: $(grep scale "$events")"
  sleep 0.05
done
grep -q '"kind": "scale_done"' "$events" || fail "the scale did not complete: $(grep -E 'mov|scale' "$events" | tail -5)"
wait_job || fail "the job failed: $(tail -n 20 "$WORK/moves.out")"
[[ "$(ledger_field moves lost)" == 0 ]] || fail "acknowledged updates lost: $(cat "$(summary moves)")"
(( $(ledger_field moves acked) > 0 )) || fail "the ledger saw no acknowledged push"
(( $(summary_field moves failovers) >= 1 )) || fail "no failover recorded"
assert_accuracy_close moves base
echo "moves: $(grep -c '"kind": "moved"' "$events") cut-over event(s), $(grep -c 'abandoned' "$events") abandoned;" \
  "ledger: $(ledger_field moves acked) pushes acknowledged, $(ledger_field moves lost) lost"
assert_nothing_left "$WORK"

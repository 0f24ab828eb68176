#!/usr/bin/env bash
# `strata scale --pservers` of a running bsp job with replication 1 (live
# partition migration, docs/reliability.md "Moving partitions"), real
# daemons under `launch.sh run`: the job starts with 1 pserver and 1
# worker of the host file's room for 3 + 3, grows to 3 pservers (the
# provider starts pservers 1 and 2, the master moves partitions onto them
# while training goes on: a copy streamed like a backup's, then a cut-over)
# and 3 workers, shrinks to 2 pservers (pserver 2's partitions and backups
# move to the others, then it exits 0, not restarted) and 1 worker, and
# finishes: every record trained once, the update ledger's lost 0 (every
# acknowledged push held by the partition's last owner), and the test accuracy within 0.02 of the same job at a
# fixed size (the workers' scale costs ~1% with its spread:
# scale_workers_test; moving partitions changes no update).
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
work="$(mktemp -d /tmp/strata-e2e-pscale-XXXXXX)"
trap '"$ROOT/scripts/launch.sh" down --run-dir "$work/run" >/dev/null 2>&1 || true; pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
base="$(pick_port_base)"
write_config "$work/job.yaml" bsp 6 "$base" 0
sed -i 's/^cluster:$/cluster:\n  replication: 1/' "$work/job.yaml"
printf 'elastic:\n  max_pservers: 3\n  max_moves: 2\n  move_rate_mb_per_s: 4\n' >> "$work/job.yaml"
printf '127.0.0.1 master pserver=1 worker=1\n' > "$work/fixed-hosts"
"$ROOT/scripts/launch.sh" run --config "$work/job.yaml" --hosts "$work/fixed-hosts" \
  --run-dir "$work/fixed" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 300 > "$work/fixed.out" 2>&1 ||
  { tail -n 20 "$work/fixed.out"; fail "the fixed-size job failed"; }
fixed_acc="$(json_field "$work/fixed/summary.json" final_test_accuracy)"
printf '127.0.0.1 master pserver=1..3 worker=1..3\n' > "$work/hosts"
master="127.0.0.1:$base"
"$ROOT/scripts/launch.sh" run --config "$work/job.yaml" --hosts "$work/hosts" \
  --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" --quiet --timeout 300 > "$work/run.out" 2>&1 &
launcher=$!
wait_steps "$master" 100

status_json() { "$STRATA" status --master "$master" --json 2>/dev/null || true; }
# alive ROLE: the indices of the members of ROLE alive and not leaving.
alive() {
  status_json | python3 -c "import json,sys
v=json.load(sys.stdin)['view']['members']
print(' '.join(sorted(str(m.get('index',0)) for m in v
  if m['role']=='$1' and m.get('state')=='ALIVE' and not m.get('draining'))))"
}
# owners: pserver index -> partitions owned, and partitions moving.
owners() {
  status_json | python3 -c "import json,sys
v=json.load(sys.stdin)['view']
idx={m['id']:m.get('index',0) for m in v['members']}
own={}
for p in v['partitions']: own[idx[p.get('owner',0)]]=own.get(idx[p.get('owner',0)],0)+1
print(' '.join('%d:%d'%(k,own[k]) for k in sorted(own)),
      'moving:%d'%sum(1 for p in v['partitions'] if p.get('moveTo') or p.get('move_to')))"
}

# Grow to 3 pservers: done when they registered and the partitions moved.
out="$("$STRATA" scale --master "$master" --pservers 3 --reason e2e-grow --timeout 120)" ||
  fail "scale to 3 pservers failed: $out"$'\n'"$(tail -n 20 "$work/run/logs/master-0.log")"
echo "$out"
grep -q '^pservers 1 -> 3: starting pservers 1, 2, then moving partitions' <<< "$out" ||
  fail "unexpected scale answer: $out"
grep -qE 'scale done \(pservers 1 -> 3.*\) in [0-9.]+ s: the partitions are balanced' <<< "$out" ||
  fail "scale to 3 pservers not done: $out"
[[ "$(alive PSERVER)" == "0 1 2" ]] || fail "pservers alive after growing: '$(alive PSERVER)'"
echo "owners after growing: $(owners)"
owners | grep -qE '^0:[1-9][0-9]* 1:[1-9][0-9]* 2:[1-9][0-9]* moving:0$' ||
  fail "partitions not spread over 3 pservers: $(owners)"
grep -q '"kind": "moved"' "$work/run/events.jsonl" || fail "no moved event"

out="$("$STRATA" scale --master "$master" --workers 3 --timeout 120)" || fail "scale to 3 workers: $out"
grep -q 'scale done' <<< "$out" || fail "scale to 3 workers not done: $out"

# Shrink to 2 pservers: pserver 2 empties, then exits 0 (not restarted).
out="$("$STRATA" scale --master "$master" --pservers 2 --timeout 120)" ||
  fail "scale to 2 pservers failed: $out"$'\n'"$(tail -n 20 "$work/run/logs/master-0.log")"
echo "$out"
grep -q 'pservers 3 -> 2: draining pserver 2 once their partitions moved' <<< "$out" ||
  fail "unexpected scale answer: $out"
grep -q 'scale done' <<< "$out" || fail "scale to 2 pservers not done: $out"
for _ in $(seq 1 100); do
  [[ -f "$work/run/exit/pserver-2" ]] && break
  sleep 0.1
done
[[ "$(cat "$work/run/exit/pserver-2" 2>/dev/null)" == 0 ]] ||
  fail "pserver 2 did not exit 0 (exit: $(cat "$work/run/exit/pserver-2" 2>/dev/null))"
owners | grep -qE '^0:[1-9][0-9]* 1:[1-9][0-9]* moving:0$' || fail "after shrinking: $(owners)"
out="$("$STRATA" scale --master "$master" --workers 1 --timeout 120)" || fail "scale to 1 worker: $out"

# Refusals: below elastic.min_pservers (1 left would be fine: 0 is not).
if out="$("$STRATA" scale --master "$master" --pservers 0 2>&1)"; then
  fail "scaling to 0 pservers was accepted: $out"
fi
grep -q 'below elastic.min_pservers (1)' <<< "$out" || fail "unexpected refusal: $out"

set +e; wait "$launcher"; rc=$?; set -e
(( rc == 0 )) || { tail -n 30 "$work/run.out"; fail "launch.sh run exited $rc"; }
grep -q "restarting pserver" "$work/run.out" && fail "a drained pserver was restarted: $(cat "$work/run.out")"
summary="$work/run/summary.json"
check_scaled_job "$summary" "pservers 1 -> 3 -> 2 (workers 1 -> 3 -> 1)" "$fixed_acc" 0.02 6 replicated
grep '"kind": "mov' "$work/run/events.jsonl" | head -n 20
echo "ok: scaled pservers 1 -> 3 -> 2 while training, partitions moved live"

#!/usr/bin/env bash
# The CTR workload end to end on 127.0.0.1 through scripts/launch.sh: the
# data set is generated from the config's data.generate section (a small
# one), then 1 master, 2 pservers and 2 workers train a Wide & Deep model
# whose embeddings live in sparse tables. Mode (argument 2):
#   asp   admission at first touch, no eviction, no worker cache;
#   bsp   admission after 2 pushes, a capacity that forces evictions, and
#         the worker's row cache with a staleness bound;
#   grow  bsp's, starting with 1 pserver of room for 3 and growing to 3
#         while it trains (`strata scale --pservers 3`): the sparse virtual
#         partitions move live while rows are admitted and evicted, and the
#         AUC is reached all the same.
#   allreduce  bsp's, with the dense tables (the deep part, the wide
#         part's dense weights) by allreduce among the workers
#         (model.dense_sync: allreduce) and only the sparse tables on the
#         pservers: the same AUC; checkpoints every 150 steps hold the
#         sparse partitions and the ring's shards of the dense tables.
# Checks: launch.sh exits 0; the training file is cut into byte ranges,
# not read whole; summary.json carries final_test_auc,
# final_test_logloss and the planted model's figures, with the AUC close
# to the planted one; the pservers' /metrics count rows and keys; nothing
# is left running.
BUILD_DIR="$1"; MODE="$2"
source "$(dirname "$0")/lib.sh"

work="$(mktemp -d /tmp/strata-e2e-ctr-XXXXXX)"
trap 'pkill -KILL -f -- "$work" 2>/dev/null || true; [[ -n ${KEEP_WORK:-} ]] || rm -rf "$work"' EXIT
base="$(pick_port_base)"
consistency="$MODE"
[[ $MODE == grow || $MODE == allreduce ]] && consistency=bsp
if [[ $consistency == bsp ]]; then
  sparse_extra='  admission:
    min_count: 2
  eviction:
    capacity_rows: 4000
  cache:
    rows: 20000
    staleness_steps: 2'
  max_gap=0.10
else
  sparse_extra=''
  max_gap=0.05
fi
write_ctr_config "$work/ctr.yaml" "e2e-ctr-$MODE" "$consistency" "$base" "$work/data" "$sparse_extra"
printf '127.0.0.1 master pserver=2 worker=2\n' > "$work/hosts"
if [[ $MODE == allreduce ]]; then
  sed -i 's/^  type: wide_deep$/  type: wide_deep\n  dense_sync: allreduce/' "$work/ctr.yaml"
  grep -q '^  dense_sync: allreduce$' "$work/ctr.yaml" || fail "no model section to change"
  # Checkpoints every 150 steps: the pservers' sparse partitions and the
  # workers' ring shards of the dense tables, at one cut.
  printf 'checkpoint:\n  dir: %s\n  every_steps: 150\n  every_seconds: 0\n  keep_last: 2\n' \
    "$work/ckpt" >> "$work/ctr.yaml"
fi
if [[ $MODE == grow ]]; then
  printf 'elastic:\n  max_pservers: 3\n' >> "$work/ctr.yaml"
  printf '127.0.0.1 master pserver=1..3 worker=2\n' > "$work/hosts"
fi

"$ROOT/scripts/launch.sh" run --config "$work/ctr.yaml" --hosts "$work/hosts" \
  --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" --timeout 600 > "$work/out" 2>&1 &
launcher=$!
# The sparse tables' gauges on pserver 0, read while the job trains.
metrics=""
for _ in $(seq 1 600); do
  m="$(curl -sf "http://127.0.0.1:$((base + 30))/metrics" 2>/dev/null || true)"
  if grep -qE '^strata_pserver_sparse_rows\{table="embedding"\} [1-9]' <<< "$m"; then
    metrics="$m"
    [[ $MODE == asp ]] && break
    if [[ $MODE == grow && -z ${grown:-} ]]; then
      # Rows are being admitted: grow to 3 pservers now.
      "$STRATA" scale --master "127.0.0.1:$base" --pservers 3 --timeout 120 > "$work/scale.out" 2>&1 ||
        fail "scale to 3 pservers failed: $(cat "$work/scale.out")"
      grep -q 'scale done (pservers 1 -> 3.*the partitions are balanced' "$work/scale.out" ||
        fail "scale to 3 pservers not done: $(cat "$work/scale.out")"
      grown=1
    fi
    # bsp: wait until the capacity has evicted something.
    grep -qE '^strata_pserver_sparse_keys_evicted\{reason="capacity",table="embedding"\} [1-9]' <<< "$m" && break
  fi
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
set +e; wait "$launcher"; rc=$?; set -e
cat "$work/out"
[[ $rc -eq 0 ]] || fail "launch.sh run exited $rc"
grep -q "strata-gen-ctr: wrote 200000 train + 10000 test rows" "$work/out" ||
  fail "launch.sh did not generate the data set"
[[ -n $metrics ]] || fail "pserver 0's /metrics never showed sparse rows"
grep '^strata_pserver_sparse' <<< "$metrics"
for g in sparse_bytes sparse_keys_admitted sparse_keys_rejected; do
  grep -qE "^strata_pserver_${g}\{table=\"embedding\"\} " <<< "$metrics" || fail "no strata_pserver_$g"
done
if [[ $consistency == bsp ]]; then
  grep -qE '^strata_pserver_sparse_keys_rejected\{table="embedding"\} [1-9]' <<< "$metrics" ||
    fail "admission after 2 pushes rejected nothing"
fi

s="$work/run/summary.json"
cat "$s"
[[ "$(json_field "$s" state)" == succeeded ]] || fail "state is not succeeded"
for k in final_test_auc final_test_logloss planted_test_auc planted_test_logloss; do
  [[ -n "$(json_field "$s" $k)" ]] || fail "summary.json lacks $k"
done
auc="$(json_field "$s" final_test_auc)"
planted="$(json_field "$s" planted_test_auc)"
python3 -c "import sys; sys.exit(0 if 0.6 < $auc and $planted - $auc < $max_gap else 1)" ||
  fail "test AUC $auc is not within $max_gap of the planted model's $planted"
grep -qE '^progress: epoch [0-9]+/[0-9]+  step [0-9]+  tasks [0-9]+/[0-9]+  samples/s' "$work/out" ||
  fail "no job progress lines shown"
# The workers' own progress lines stay in their logs.
! grep -q 'progress: worker' "$work/out" || fail "per-worker progress lines shown"
grep -q 'progress: worker' "$work/run/logs/worker-0.log" || fail "no progress lines in worker 0's log"
# The master cut the text file by bytes (it read only its start); each
# worker read its tasks' ranges, not the whole file.
cat "$work"/run/logs/master*.log > "$work/master.log"
grep -q 'train.txt: .* bytes, about .* records .*cut into data tasks of' "$work/master.log" ||
  fail "the master did not cut train.txt into byte ranges"
cat "$work"/run/logs/worker*.log > "$work/workers.log"
grep -q 'training records read per data task from' "$work/workers.log" ||
  fail "a worker loaded the whole training file"
if [[ $MODE == allreduce ]]; then
  # Both workers stepped their dense tables in one ring; the pservers were
  # given only the sparse tables' partitions (8 virtual ones each).
  for w in 0 1; do
    grep -q "dense allreduce: ring of view [0-9]*: nodes [0-9]*, [0-9]*," \
      "$work/run/logs/worker-$w.log" || fail "worker $w formed no ring of 2"
  done
  grep -q "placed 16 partition(s) of 7 table(s)" "$work/master.log" ||
    fail "the pservers were given partitions of allreduce tables: $(grep placed "$work/master.log")"
  # Checkpoints by steps and the final one, each with the 16 partitions
  # and the ring's 2 shards, read back whole.
  grep -q "checkpoint [0-9]* (steps, " "$work/master.log" || fail "no checkpoint by steps: $(grep -i checkpoint "$work/master.log" | tail -5)"
  last="$(ls -d "$work/ckpt"/ckpt-* | sort | tail -n 1)"
  "$STRATA" checkpoint verify --dir "$last" | tee "$work/verify.out" | grep -q "16 partitions, 2 ring shards," ||
    fail "the last checkpoint is not of 16 partitions and 2 ring shards: $(cat "$work/verify.out")"
  # Its inference export: the 5 dense tables put together from the ring's
  # shards, a partition each, beside the 16 sparse ones.
  "$STRATA" checkpoint export --dir "$last" --out "$work/export" --precision bf16 |
    tee "$work/export.out" | grep -q "21 partitions" ||
    fail "the export is not of 21 partitions: $(cat "$work/export.out")"
  "$STRATA" checkpoint verify --dir "$work/export" > "$work/verify-export.out" ||
    fail "the export does not verify: $(cat "$work/verify-export.out")"
fi
if [[ $MODE == grow ]]; then
  cat "$work/scale.out"
  [[ -n ${grown:-} ]] || fail "the job was never grown"
  # Every pserver served sparse partitions at the end.
  python3 - "$work/run/events.jsonl" <<'PY' || fail "the sparse partitions did not spread over 3 pservers"
import json, re, sys
moved = [json.loads(l)["message"] for l in open(sys.argv[1]) if '"kind": "moved"' in l]
print("moves:", *moved, sep="\n  ")
targets = {t for m in moved for t in re.findall(r"node \d+ -> (\d+)", m)}
assert len(targets) >= 2, targets
PY
fi
assert_nothing_left "$work"
echo "PASS: $MODE AUC $auc (planted $planted)"

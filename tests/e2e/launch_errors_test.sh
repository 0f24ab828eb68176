#!/usr/bin/env bash
# launch.sh refuses bad input with a message naming the file and line, and
# cleans up when a daemon cannot start.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
work="$(mktemp -d /tmp/strata-e2e-errors-XXXXXX)"
trap 'pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
base="$(pick_port_base)"
write_config "$work/job.yaml" bsp 1 "$base"

# must_fail WHAT CONFIG HOSTS RUN_DIR [ARGS...]: `launch.sh run` must exit
# non-zero; its output is left in $out.
must_fail() {
  local what="$1" config="$2" hosts="$3" dir="$4" rc
  shift 4
  set +e
  out="$("$ROOT/scripts/launch.sh" run --config "$config" --hosts "$hosts" \
    --run-dir "$dir" --bin-dir "$BUILD_DIR/bin" "$@" 2>&1)"; rc=$?
  set -e
  echo "$out"
  [[ $rc -ne 0 ]] || fail "$what accepted"
}
printf '127.0.0.1 master pserver=2\n127.0.0.1 worker=x\n' > "$work/bad.hosts"

must_fail "bad host file" "$work/job.yaml" "$work/bad.hosts" "$work/run"
grep -q "bad.hosts:2" <<< "$out" || fail "error does not name bad.hosts:2"

sed 's/epochs: 1/epochs: many/' "$work/job.yaml" > "$work/bad.yaml"
printf '127.0.0.1 master pserver=1 worker=1\n' > "$work/hosts"
must_fail "bad config" "$work/bad.yaml" "$work/hosts" "$work/run2"
grep -qE "bad.yaml:[0-9]+:[0-9]+: job.epochs" <<< "$out" || fail "error does not name bad.yaml:line:col: job.epochs"

# A missing data file: the master fails to start; launch.sh reports it and
# nothing is left running.
sed "s#train-labels-idx1-ubyte.gz#no-such-file.gz#" "$work/job.yaml" > "$work/nodata.yaml"
must_fail "missing data file" "$work/nodata.yaml" "$work/hosts" "$work/run3" --timeout 60
grep -q "no-such-file.gz" "$work/run3/logs/master-0.log" || fail "master log does not name the missing file"
assert_nothing_left "$work"

# A worker told to use a GPU on a machine without one does not start, and
# its log says why (where there is a GPU, nothing to check here).
if ! "$BUILD_DIR/bin/strata-step-bench" --device cuda --layers 4,2 --batch 1 --steps 1 \
     > /dev/null 2>&1; then
  cp "$work/job.yaml" "$work/gpu.yaml"
  printf 'worker:\n  device: cuda\n' >> "$work/gpu.yaml"
  must_fail "worker.device cuda without a GPU" "$work/gpu.yaml" "$work/hosts" "$work/run4" \
    --timeout 60
  grep -q "worker.device is cuda but .*(set worker.device: cpu or auto" \
    "$work/run4/logs/worker-0.log" ||
    fail "the worker's log does not say why it has no GPU: $(tail -n 3 "$work/run4/logs/worker-0.log")"
  assert_nothing_left "$work"
fi

# `run` into the run dir of a live cluster refuses, and leaves that cluster
# alone.
write_config "$work/live.yaml" bsp 50 "$(pick_port_base)"
"$ROOT/scripts/launch.sh" up --config "$work/live.yaml" --hosts "$work/hosts" \
  --run-dir "$work/live" --bin-dir "$BUILD_DIR/bin"
must_fail "run into a live cluster's run dir" "$work/live.yaml" "$work/hosts" "$work/live"
grep -q "already has a running cluster" <<< "$out" || fail "no 'already has a running cluster' message"
daemon_ok=1
for f in "$work"/live/pids/*; do
  read -r _ pid < "$f"; kill -0 "$pid" 2>/dev/null || daemon_ok=0
done
(( daemon_ok == 1 )) || fail "the refused run stopped the live cluster"
# The master's provider (launch.sh provide) refuses what it cannot start,
# saying why: an index the host file has no room for, a bad role or action,
# a run dir launch.sh did not start.
provide() { "$ROOT/scripts/launch.sh" provide "$@" 2>&1 && fail "provide $* succeeded"; true; }
grep -q "provide: no worker 7 in the host file's plan" <<< "$(provide --run-dir "$work/live" \
  --action add --role worker --indices 7)" || fail "provide of an index out of the room"
grep -q "provide: --role worker|pserver, got 'master'" <<< "$(provide --run-dir "$work/live" \
  --action add --role master --indices 0)" || fail "provide of a bad role"
grep -q "provide: --action add|remove, got 'grow'" <<< "$(provide --run-dir "$work/live" \
  --action grow --role worker --indices 0)" || fail "provide of a bad action"
grep -q "provide needs --run-dir of a cluster launch.sh started" <<< "$(provide --run-dir "$work" \
  --action add --role worker --indices 0)" || fail "provide outside a run dir"
"$ROOT/scripts/launch.sh" down --run-dir "$work/live"
assert_nothing_left "$work"
echo "PASS"

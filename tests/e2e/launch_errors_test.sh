#!/usr/bin/env bash
# launch.sh refuses bad input with a message naming the file and line, and
# cleans up when a daemon cannot start.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
work="$(mktemp -d /tmp/strata-e2e-errors-XXXXXX)"
trap 'pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
base="$(pick_port_base)"
write_config "$work/job.yaml" bsp 1 "$base"
printf '127.0.0.1 master pserver=2\n127.0.0.1 worker=x\n' > "$work/bad.hosts"

set +e
out="$("$ROOT/scripts/launch.sh" run --config "$work/job.yaml" --hosts "$work/bad.hosts" \
  --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" 2>&1)"; rc=$?
set -e
echo "$out"
[[ $rc -ne 0 ]] || fail "bad host file accepted"
grep -q "bad.hosts:2" <<< "$out" || fail "error does not name bad.hosts:2"

sed 's/epochs: 1/epochs: many/' "$work/job.yaml" > "$work/bad.yaml"
printf '127.0.0.1 master pserver=1 worker=1\n' > "$work/hosts"
set +e
out="$("$ROOT/scripts/launch.sh" run --config "$work/bad.yaml" --hosts "$work/hosts" \
  --run-dir "$work/run2" --bin-dir "$BUILD_DIR/bin" 2>&1)"; rc=$?
set -e
echo "$out"
[[ $rc -ne 0 ]] || fail "bad config accepted"
grep -qE "bad.yaml:[0-9]+:[0-9]+: job.epochs" <<< "$out" || fail "error does not name bad.yaml:line:col: job.epochs"

# A missing data file: the master fails to start; launch.sh reports it and
# nothing is left running.
sed "s#train-labels-idx1-ubyte.gz#no-such-file.gz#" "$work/job.yaml" > "$work/nodata.yaml"
set +e
out="$("$ROOT/scripts/launch.sh" run --config "$work/nodata.yaml" --hosts "$work/hosts" \
  --run-dir "$work/run3" --bin-dir "$BUILD_DIR/bin" --timeout 60 2>&1)"; rc=$?
set -e
echo "$out"
[[ $rc -ne 0 ]] || fail "missing data file accepted"
grep -q "no-such-file.gz" "$work/run3/logs/master-0.log" || fail "master log does not name the missing file"
assert_nothing_left "$work"

# `run` into the run dir of a live cluster refuses, and leaves that cluster
# alone.
write_config "$work/live.yaml" bsp 50 "$(pick_port_base)"
"$ROOT/scripts/launch.sh" up --config "$work/live.yaml" --hosts "$work/hosts" \
  --run-dir "$work/live" --bin-dir "$BUILD_DIR/bin"
set +e
out="$("$ROOT/scripts/launch.sh" run --config "$work/live.yaml" --hosts "$work/hosts" \
  --run-dir "$work/live" --bin-dir "$BUILD_DIR/bin" 2>&1)"; rc=$?
set -e
echo "$out"
[[ $rc -ne 0 ]] || fail "run into a live cluster's run dir accepted"
grep -q "already has a running cluster" <<< "$out" || fail "no 'already has a running cluster' message"
daemon_ok=1
for f in "$work"/live/pids/*; do
  read -r _ pid < "$f"; kill -0 "$pid" 2>/dev/null || daemon_ok=0
done
(( daemon_ok == 1 )) || fail "the refused run stopped the live cluster"
"$ROOT/scripts/launch.sh" down --run-dir "$work/live"
assert_nothing_left "$work"
echo "PASS"

# Helpers for the real-binary cluster tests. Sourced; expects BUILD_DIR.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STRATA="$BUILD_DIR/bin/strata"
FMNIST=/usr/share/datasets/fashion-mnist

# fail MESSAGE: the message, and when it runs long (logs appended), its
# first line again at the end: CI shows the head and the tail of a long
# output, not the middle.
fail() {
  echo "FAIL: $*" >&2
  local first="${*%%$'\n'*}"
  [[ "$first" == "$*" ]] || echo "FAIL (the reason above, again): $first" >&2
  exit 1
}
skip() { echo "SKIP: $*"; exit 77; }

# A port base no other test running at the same time has: free now (ss)
# and reserved (mkdir, atomic) in /tmp/strata-test-ports, so that two tests
# starting together cannot both take it before either listens. A test's
# daemons then never reach another test's (a worker registering with the
# wrong master hung a job once). A reservation names its test's process
# (pid): it is let go once that process has exited, or after 20 minutes (no
# test of the suite runs longer), so the 120 bases last a whole suite.
pick_port_base() {
  local base dir=/tmp/strata-test-ports r pid
  mkdir -p "$dir"
  for r in "$dir"/*; do
    [[ -d $r ]] || continue
    pid="$(cat "$r/pid" 2>/dev/null || true)"
    if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then rm -rf "$r"; fi
  done
  find "$dir" -mindepth 1 -maxdepth 1 -mmin +20 -exec rm -rf {} + 2>/dev/null || true
  for _ in $(seq 1 200); do
    base=$(( 20000 + (RANDOM % 120) * 100 ))  # below the ephemeral range
    if ! ss -ltn 2>/dev/null | grep -qE ":($base|$((base+1))|$((base+10))|$((base+20))|$((base+30))|$((base+40)))\b" &&
       mkdir "$dir/$base" 2>/dev/null; then
      echo "$$" > "$dir/$base/pid"  # (the test's shell: $$ in a subshell too)
      echo "$base"; return 0
    fi
  done
  echo "pick_port_base: no free port base in 200 tries" >&2
  return 1
}

# write_config FILE CONSISTENCY EPOCHS PORT_BASE [TRAIN_LIMIT [TASK_RECORDS]]
# (TASK_RECORDS 2000 unless given.)
write_config() {
  local file="$1" consistency="$2" epochs="$3" base="$4" limit="${5:-0}" task_records="${6:-2000}"
  cat > "$file" <<YAML
job:
  name: e2e-$consistency
  consistency: $consistency
  epochs: $epochs
  batch_size: 64
  progress_every_steps: 100
  seed: 7
model:
  layers: [784, 128, 10]
  activation: relu
optimizer:
  type: adam
  learning_rate: 0.001
data:
  train_images: $FMNIST/train-images-idx3-ubyte.gz
  train_labels: $FMNIST/train-labels-idx1-ubyte.gz
  test_images: $FMNIST/t10k-images-idx3-ubyte.gz
  test_labels: $FMNIST/t10k-labels-idx1-ubyte.gz
  task_records: $task_records
  train_limit: $limit
$(cluster_yaml "$base")
YAML
}

# write_ctr_config FILE NAME CONSISTENCY PORT_BASE DATA_DIR [SPARSE_EXTRA]:
# the CTR workload's config (docs/sparse.md): a Wide & Deep model over
# sparse tables of 8 virtual partitions, one epoch of 200 000 rows that
# launch.sh generates into DATA_DIR (from the planted model), in data
# tasks of 20 000; SPARSE_EXTRA: more of the sparse section (indented).
write_ctr_config() {
  local file="$1" name="$2" consistency="$3" base="$4" data="$5" sparse_extra="${6:-}"
  cat > "$file" <<YAML
$(ctr_head_yaml "$name" "$consistency" 1 256 8)
  optimizer:
    type: adagrad
    learning_rate: 0.05
    initial_accumulator: 0.1
$sparse_extra
data:
  format: criteo
  train: $data/train.txt
  test: $data/test.txt
  planted: $data/planted.json
  task_records: 20000
  generate:
    out_dir: $data
    train_rows: 200000
    test_rows: 10000
    seed: 5
    max_vocab: 300
$(cluster_yaml "$base")
YAML
}

# ctr_head_yaml NAME CONSISTENCY EPOCHS BATCH PARTITIONS: the CTR configs'
# job, model (Wide & Deep, embeddings of 4, a hidden layer of 16) and
# optimizer sections, and the first line of their sparse section.
ctr_head_yaml() {
  cat <<YAML
job:
  name: $1
  consistency: $2
  epochs: $3
  batch_size: $4
  progress_every_steps: 50
  seed: 3
model:
  type: wide_deep
  embedding_dim: 4
  hidden: [16]
optimizer:
  type: adam
  learning_rate: 0.002
sparse:
  partitions: $5
YAML
}

# cluster_yaml PORT_BASE: the cluster section of the tests' configs: tcp,
# fast failure detection, ports PORT_BASE + {0, 1, 10, 20, 30, 40}; and
# their security section: plain text unless TEST_SECURITY=mtls (launch.sh
# then makes certificates in the run directory: STRATA_TLS_DIR=RUN/tls/admin
# for the strata CLI).
cluster_yaml() {
  local base="$1"
  cat <<YAML
cluster:
  transport: tcp
  slice_bytes: 131072
  heartbeat_interval_ms: 200
  dead_timeout_ms: 2000
  ports:
    master: $base
    master_http: $((base + 1))
    pserver: $((base + 10))
    pserver_data: $((base + 20))
    pserver_http: $((base + 30))
    worker_http: $((base + 40))
security:
  mode: ${TEST_SECURITY:-plaintext}
YAML
}

# http_get HOST:PORT/PATH: the body of a daemon's endpoint (fails on an
# error status). An mtls job serves HTTPS only, to people: then the admin
# certificate of $HTTP_TLS_DIR, else $STRATA_TLS_DIR (ca.crt, client.crt,
# client.key); plain http when neither is set.
http_get() {
  local tls="${HTTP_TLS_DIR:-${STRATA_TLS_DIR:-}}"
  if [[ -n "$tls" ]]; then
    curl -sf --cacert "$tls/ca.crt" --cert "$tls/client.crt" --key "$tls/client.key" "https://$1"
  else
    curl -sf "http://$1"
  fi
}

json_field() {  # json_field FILE KEY -> value (numbers/strings, first match)
  sed -n "s/.*\"$2\": *\"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}\$/\1/p" "$1" | head -n 1
}

# check_scaled_job SUMMARY WHAT FIXED_ACC TOLERANCE EPOCHS [replicated]:
# a job scaled while it trained (WHAT says how) succeeded, its test
# accuracy within TOLERANCE of FIXED_ACC (the same job at a fixed size),
# its update ledger lost nothing (replicated: every acknowledged push
# held), and it trained every record of EPOCHS epochs of Fashion-MNIST.
check_scaled_job() {
  local summary="$1"
  [[ "$(json_field "$summary" state)" == succeeded ]] || fail "job did not succeed: $(cat "$summary")"
  python3 - "$@" <<'PY' || fail "summary after scaling: $(cat "$summary")"
import json, sys
summary, what, fixed, tolerance, epochs = sys.argv[1:6]
replicated = sys.argv[6:] == ["replicated"]
s = json.load(open(summary))
acc, fixed = s["final_test_accuracy"], float(fixed)
print("test accuracy after %s: %.4f, at a fixed size: %.4f" % (what, acc, fixed))
assert abs(acc - fixed) <= float(tolerance), (acc, fixed)
ledger = s.get("ledger", {})
assert int(ledger.get("lost", 0)) == 0, ledger
if replicated:
    assert int(ledger.get("held", 0)) == int(ledger.get("acked", 0)) > 0, ledger
assert int(s.get("records_done", 0)) == int(epochs) * 60000, s.get("records_done")
PY
}

# check_job SUMMARY WHAT RECORDS MIN_ACCURACY: a job that ran to its end
# succeeded, trained RECORDS records, lost nothing acknowledged (the
# update ledger) and reached MIN_ACCURACY.
check_job() {
  python3 - "$@" <<'PY' || fail "$2 summary: $(cat "$1")"
import json, sys
summary, what, records, accuracy = sys.argv[1:5]
s = json.load(open(summary))
print('%s: test accuracy %.4f, ledger %s' % (what, s['final_test_accuracy'], s.get('ledger')))
assert s['state'] == 'succeeded', s['state']
assert int(s.get('ledger', {}).get('lost', 0)) == 0, s.get('ledger')
assert int(s.get('records_done', 0)) == int(records), s.get('records_done')
assert s['final_test_accuracy'] >= float(accuracy), s['final_test_accuracy']
PY
}

# log_tails RUN_DIR [LINES]: the last LINES (15) of each daemon's log
# under RUN_DIR/logs (the work dir goes with the test; a failure shows
# them).
log_tails() {
  local f lines="${2:-15}"
  for f in "$1"/logs/*.log; do
    [[ -f $f ]] || continue
    echo "--- ${f##*/} (last $lines lines)"
    tail -n "$lines" "$f" | cut -c1-400
  done
}

# No process of this run may be left.
assert_nothing_left() {
  local dir="$1"
  sleep 0.2
  if pgrep -f -- "$dir" > /dev/null; then
    pgrep -fa -- "$dir" >&2
    pkill -KILL -f -- "$dir" || true
    fail "processes of $dir left running"
  fi
}

# The steps the job whose master is ADDR has done; nothing when it does not
# answer.
steps_of() {  # steps_of ADDR
  { "$STRATA" status --master "$1" --json 2>/dev/null || true; } |
    sed -n 's/.*"steps": "\([0-9]*\)".*/\1/p' | head -n 1
}
# wait_steps ADDR N: until the job at ADDR has done N steps (at most 60 s).
wait_steps() {
  for _ in $(seq 1 1200); do
    local s; s="$(steps_of "$1")"
    [[ -n "$s" && "$s" -ge "$2" ]] && return 0
    sleep 0.05
  done
  fail "job at $1 did not reach step $2"
}
# expect_stopped OUT WHAT: the launcher started in the background (its pid
# in $launcher, its output in OUT) ends, within 90 s, with 3: the exit
# status of a job stopped after a checkpoint.
expect_stopped() {
  for _ in $(seq 1 900); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  set +e; wait "$launcher"; rc=$?; set -e
  (( rc == 3 )) || { tail -n 30 "$1"; fail "$2 exited $rc, expected 3 (stopped)"; }
}

# checkpoint_stop MASTER OUT LAUNCH_OUT WHAT [RUN_DIR]: `strata checkpoint
# --stop` of the job at MASTER (what it prints into OUT), then
# expect_stopped LAUNCH_OUT WHAT. A failed command shows OUT and, with
# RUN_DIR, the run's log tails.
checkpoint_stop() {
  "$STRATA" checkpoint --master "$1" --stop > "$2" 2>&1 ||
    { cat "$2"; [[ -z ${5:-} ]] || log_tails "$5"; fail "strata checkpoint --stop failed ($4)"; }
  expect_stopped "$3" "$4"
}

# ctr_job_yaml NAME EPOCHS DATA_DIR TRAIN_ROWS PORT_BASE CHECKPOINT_DIR [TRAIN]
# A bsp Wide & Deep job on data strata-gen-ctr makes in DATA_DIR (Zipf 1.3,
# 20000 values a field), with incremental checkpoints into CHECKPOINT_DIR
# every 40 steps. TRAIN given: the training file is read from there and
# nothing is generated. $CTR_SPARSE_EXTRA: more lines of the sparse section.
ctr_job_yaml() {
  local train="${7:-$3/train.txt}" generate=""
  [[ -n ${7:-} ]] || generate="  generate:
    out_dir: $3
    train_rows: $4
    test_rows: 5000
    seed: 9
    zipf: 1.3
    max_vocab: 20000"
  cat <<YAML
$(ctr_head_yaml "$1" bsp "$2" 128 4)
${CTR_SPARSE_EXTRA:-}
data:
  format: criteo
  train: $train
  test: $3/test.txt
  task_records: 5000
$generate
$(cluster_yaml "$5")
checkpoint:
  dir: $6
  every_steps: 40
  every_seconds: 0
  full_every: 1000          # every checkpoint after the first incremental
  keep_last: 2
YAML
}

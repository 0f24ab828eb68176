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

# A port base unlikely to collide with another test running at the same time.
pick_port_base() {
  local base
  for _ in $(seq 1 50); do
    base=$(( 20000 + (RANDOM % 120) * 100 ))  # below the ephemeral range
    if ! ss -ltn 2>/dev/null | grep -qE ":($base|$((base+1))|$((base+10))|$((base+20))|$((base+30))|$((base+40)))\b"; then
      echo "$base"; return 0
    fi
  done
  echo "$base"
}

# write_config FILE CONSISTENCY EPOCHS PORT_BASE [TRAIN_LIMIT]
write_config() {
  local file="$1" consistency="$2" epochs="$3" base="$4" limit="${5:-0}"
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
  task_records: 2000
  train_limit: $limit
$(cluster_yaml "$base")
YAML
}

# cluster_yaml PORT_BASE: the cluster section of the tests' configs: tcp,
# fast failure detection, ports PORT_BASE + {0, 1, 10, 20, 30, 40}.
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
YAML
}

json_field() {  # json_field FILE KEY -> value (numbers/strings, first match)
  sed -n "s/.*\"$2\": *\"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}\$/\1/p" "$1" | head -n 1
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

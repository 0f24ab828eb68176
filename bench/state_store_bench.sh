#!/usr/bin/env bash
# What keeping the master's state in etcd costs per completed data task
# (master high availability, docs/reliability.md) against the state
# directory's local log, measured in the same run: a 3-member etcd on this
# machine's loopback (each member syncing its own log, as on three
# management nodes), strata-state-log-bench alternating --store file and
# --store etcd, the median of each.
#   bench/state_store_bench.sh [BUILD_DIR] [--tasks N] [--pairs P]
set -euo pipefail
BUILD_DIR="${1:-build}"; shift || true
TASKS=100000
PAIRS=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tasks) TASKS="$2"; shift 2 ;;
    --pairs) PAIRS="$2"; shift 2 ;;
    *) echo "state_store_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
BENCH="$BUILD_DIR/bin/strata-state-log-bench"
[[ -x "$BENCH" ]] || { echo "no $BENCH: build first (scripts/build.sh)" >&2; exit 1; }
[[ -x /usr/bin/etcd ]] || { echo "no /usr/bin/etcd: apt-get install etcd-server" >&2; exit 1; }

WORK="$(mktemp -d /tmp/strata-state-store-bench-XXXXXX)"
pids=()
trap 'kill -KILL "${pids[@]}" 2>/dev/null; rm -rf "$WORK"' EXIT
base=$(( 30000 + RANDOM % 20000 ))
members=""
for i in 0 1 2; do members+="${members:+,}e$i=http://127.0.0.1:$((base + 10 + i))"; done
for i in 0 1 2; do
  /usr/bin/etcd --name "e$i" --data-dir "$WORK/e$i" \
    --listen-client-urls "http://127.0.0.1:$((base + i))" \
    --advertise-client-urls "http://127.0.0.1:$((base + i))" \
    --listen-peer-urls "http://127.0.0.1:$((base + 10 + i))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((base + 10 + i))" \
    --initial-cluster "$members" --initial-cluster-state new > "$WORK/e$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 1 100); do
  ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$base" endpoint health > /dev/null 2>&1 && break
  sleep 0.1
done

file=() etcd=()
for p in $(seq 1 "$PAIRS"); do
  for store in file etcd; do
    line="$("$BENCH" --tasks "$TASKS" --samples 200 --store "$store" --etcd "127.0.0.1:$base" \
              --dir "$WORK/state-$p-$store")"
    echo "$line"
    us="$(sed -n 's/.*recorded: \([0-9.]*\) us.*/\1/p' <<< "$line")"
    if [[ $store == file ]]; then file+=("$us"); else etcd+=("$us"); fi
  done
done
python3 - "${file[*]}" "${etcd[*]}" <<'PY'
import statistics, sys
f = statistics.median(float(x) for x in sys.argv[1].split())
e = statistics.median(float(x) for x in sys.argv[2].split())
print(f"per completed task (median of {len(sys.argv[1].split())}): state directory {f:.0f} us, "
      f"etcd (3 members) {e:.0f} us: {e / f:.2f}x the local log")
PY

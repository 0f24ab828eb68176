#!/usr/bin/env bash
# Scaling across hosts on shaped links (docs/performance.md, "Scaling past
# one machine"): hosts are network namespaces on a bridge (as the
# multi-host tests make them); each worker host's link is shaped by tc tbf
# to RATE Mbit/s each way, the pserver host's to 4 x RATE. A bsp job (an
# MLP 784-256-10 on Fashion-MNIST, 4 workers a host, 1 pserver, TCP) runs
# for about STEPS steps on 1, 2 and 4 worker hosts; for each: samples/s,
# the workers' comm share, and the bytes the pserver host received a step
# (its interface's counter). Then strata-scale-sim models the same cluster
# (its compute per sample taken from the 1-host run, its TCP costs from
# strata-bench) and the measured samples/s are set against the model's.
# Each host count runs with cluster.aggregation none and node, one after
# the other, and their ratio is printed.
#   bench/shaped_scale_bench.sh [BUILD_DIR] [--rate MBIT] [--hosts "1 2 4"] [--steps N]
#                               [--aggregation "none node"] [--latency MS]
# (--latency: the most a tbf queue holds a packet, 100 ms by default.)
# Needs root (namespaces, tc).
set -euo pipefail
BUILD_DIR="$(cd "${1:-build}" && pwd)"; shift || true
rate=200 host_counts="1 2 4" steps=100 aggregations="none node" latency=100
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rate) rate="$2"; shift 2 ;;
    --hosts) host_counts="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --aggregation) aggregations="$2"; shift 2 ;;
    --latency) latency="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
source "$(dirname "$0")/../tests/e2e/lib.sh"
source "$ROOT/tests/ops/hosts_lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || { echo "dataset-fashion-mnist not installed" >&2; exit 2; }
bridge=strata-shb subnet=10.213.77 veth=shb
hosts=(1 2 3 4 5)  # 1: master and pserver; 2-5: workers
ns_of() { echo "strata-shb-$1"; }
work="$(mktemp -d /tmp/strata-shaped-XXXXXX)"
trap 'set +e; remove_hosts; [[ -n "${KEEP_WORK:-}" ]] || rm -rf "$work"' EXIT
set +e; remove_hosts; set -e  # (a run killed before left them)
make_hosts
shape_link 1 $((4 * rate)) 64kb "$latency"
for h in 2 3 4 5; do shape_link "$h" "$rate" 64kb "$latency"; done
write_ns_exec "$work/ns-exec"
rx_bytes() {  # rx_bytes HOST: bytes received on its link so far
  ip -n "$(ns_of "$1")" -s -j link show eth0 | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)[0]['stats64']['rx']['bytes'])"
}

params=$(( 784 * 256 + 256 + 256 * 10 + 10 ))
printf '%-6s %-8s %-6s %10s %8s %12s %12s\n' hosts workers agg samples/s comm "ps rx MB/st" "grad MB/st"
results=()
for k in $host_counts; do
  for agg in $aggregations; do
    base="$(pick_port_base)"
    job="$work/job-$k-$agg.yaml"
    write_config "$job" bsp 1 "$base" $(( steps * 64 * 4 * k ))
    sed -i "s/^  layers: \[784, 128, 10\]\$/  layers: [784, 256, 10]/; s/^  task_records: 2000\$/  task_records: 1024/; s/^cluster:\$/cluster:\n  aggregation: $agg/" "$job"
    printf '%s master pserver=1\n' "$(addr_of 1)" > "$work/hosts-$k"
    for h in $(seq 2 $((k + 1))); do printf '%s worker=4\n' "$(addr_of "$h")" >> "$work/hosts-$k"; done
    before="$(rx_bytes 1)"
    "$ROOT/scripts/launch.sh" run --config "$job" --hosts "$work/hosts-$k" \
      --run-dir "$work/run-$k-$agg" --bin-dir "$BUILD_DIR/bin" --remote-all --remote-cmd "$work/ns-exec" \
      --quiet --timeout 900 > "$work/run-$k-$agg.out" 2>&1 || { tail -n 30 "$work/run-$k-$agg.out"; exit 1; }
    after="$(rx_bytes 1)"
    row="$(/usr/bin/python3 - "$work/run-$k-$agg/summary.json" "$k" "$((after - before))" "$params" "$agg" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
k, rx, params, agg = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
steps = int(s['steps'])  # (bsp: the job's steps)
print(k, 4 * k, agg, '%.0f' % s['samples_per_sec'], '%.3f' % s['comm_share'],
      '%.2f' % (rx / steps / 1e6), '%.2f' % (4 * k * params * 4 / 1e6))
PY
)"
    read -r hk wk ag sps comm rxs grad <<< "$row"
    printf '%-6s %-8s %-6s %10s %8s %12s %12s\n' "$hk" "$wk" "$ag" "$sps" "$comm" "$rxs" "$grad"
    results+=("$row")
  done
done

# The model of the same cluster: compute per parameter-sample from the
# first run (its step time less its waits), TCP costs measured here.
read -r _ w1 _ sps1 comm1 _ _ <<< "${results[0]}"
compute=$(/usr/bin/python3 -c "print((1 - $comm1) * ($w1 * 64 / $sps1) / (64 * $params))")
calib="$work/calib.json"
"$BUILD_DIR/bin/strata-bench" --json --mode pushpull,apply --sizes 4K,64K --seconds 1 > "$calib" 2>/dev/null
"$BUILD_DIR/bin/strata-scale-sim" --calibration "$calib" --rdma=false --layers "$((784 * 256 + 256)),$((256 * 10 + 10))" \
  --batch 64 --nodes "$(tr ' ' ',' <<< "$host_counts")" --gpus_per_node 4 --pservers 1 \
  --link_gbps "$(/usr/bin/python3 -c "print($rate / 1000)")" \
  --pserver_link_gbps "$(/usr/bin/python3 -c "print(4 * $rate / 1000)")" \
  --compute_s_per_param_sample "$compute" --json > "$work/sim.json"
/usr/bin/python3 - "$work/sim.json" "${results[@]}" <<'PY'
import json, sys
sim = {(r['nodes'], r['aggregation']): r for r in json.load(open(sys.argv[1]))}
measured = {}
for row in sys.argv[2:]:
    k, _, agg, sps = row.split()[:4]
    measured[(int(k), agg)] = float(sps)
print('\nmodel against measured:')
print('%-6s %-6s %12s %12s %8s' % ('hosts', 'agg', 'measured', 'model', 'ratio'))
for (k, agg), sps in sorted(measured.items()):
    r = sim.get((k, agg))
    if r is None:
        continue
    print('%-6s %-6s %12.0f %12.0f %8.2f' % (k, agg, sps, r['samples_per_second'],
                                            r['samples_per_second'] / sps))
print('\nnode aggregation against none (samples/s):')
for k in sorted({k for k, _ in measured}):
    if (k, 'node') in measured and (k, 'none') in measured:
        print('%-6s %8.2fx' % (k, measured[(k, 'node')] / measured[(k, 'none')]))
PY

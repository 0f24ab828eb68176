#!/usr/bin/env bash
# Metrics of a running local cluster (1 master, 2 pservers, 2 workers):
#   - every daemon's /metrics is the Prometheus text format: HELP and TYPE
#     for every family, every sample of a declared family, numbers for
#     values, histograms with cumulative buckets ending at +Inf;
#   - the series the operators' dashboard needs are there with sane values
#     (push/pull latency and bytes, step time by phase, samples/s, comm
#     share, queue depths, heartbeat ages, checkpoint time and bytes,
#     memory);
#   - every query of conf/grafana/strata.json names only metrics Strata
#     exports;
#   - with Debian's prometheus installed: a real Prometheus scrapes the
#     cluster from the config `strata prometheus-config` makes from the host
#     file, every target is up, the series arrive with sane values through
#     its HTTP API, and every dashboard query evaluates there.
BUILD_DIR="$1"
source "$(dirname "$0")/../e2e/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"

work="$(mktemp -d /tmp/strata-metrics-XXXXXX)"
cleanup() {
  [[ -n ${prom_pid:-} ]] && kill "$prom_pid" 2>/dev/null
  "$ROOT/scripts/launch.sh" down --run-dir "$work/run" > /dev/null 2>&1 || true
  pkill -KILL -f -- "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
base="$(pick_port_base)"
write_config "$work/job.yaml" bsp 50 "$base"
cat >> "$work/job.yaml" <<YAML
checkpoint:
  dir: $work/ckpt
  every_steps: 30
  every_seconds: 0
  keep_last: 2
YAML
printf '127.0.0.1 master pserver=2 worker=2\n' > "$work/hosts"
"$ROOT/scripts/launch.sh" up --config "$work/job.yaml" --hosts "$work/hosts" \
  --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" > "$work/up.out" 2>&1 ||
  { cat "$work/up.out"; fail "launch.sh up failed"; }
wait_steps "127.0.0.1:$base" 100
# Until a checkpoint is done (every 30 steps), at most 60 s.
for _ in $(seq 1 600); do
  m="$(curl -sf "http://127.0.0.1:$((base + 1))/metrics" || true)"
  grep -qE '^strata_master_checkpoints [1-9]' <<< "$m" && break
  sleep 0.1
done

# Every daemon's /metrics, from the plan.
"$STRATA" plan --config "$work/job.yaml" --hosts "$work/hosts" > "$work/plan"
mkdir -p "$work/metrics"
while read -r role index host _ _ http; do
  curl -sf "http://$host:$http/metrics" > "$work/metrics/$role-$index" ||
    fail "no /metrics from $role $index at $host:$http"
done < "$work/plan"

python3 - "$work/metrics" "$ROOT/conf/grafana/strata.json" > "$work/check.out" 2>&1 <<'PY' ||
import json, math, os, re, sys
mdir, dashboard = sys.argv[1], sys.argv[2]
errors = []
families = {}  # name -> type, over all daemons
samples = {}   # (daemon, series name) -> list of (labels, value)
line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$')
for daemon in sorted(os.listdir(mdir)):
    helps, types = set(), {}
    for n, line in enumerate(open(os.path.join(mdir, daemon)), 1):
        line = line.rstrip('\n')
        where = f'{daemon}:{n}'
        if line.startswith('# HELP '):
            helps.add(line.split(' ')[2]); continue
        if line.startswith('# TYPE '):
            _, _, name, kind = line.split(' ')
            if kind not in ('counter', 'gauge', 'histogram'):
                errors.append(f'{where}: type {kind}')
            if name not in helps:
                errors.append(f'{where}: TYPE of {name} without HELP before it')
            types[name] = kind; families[name] = kind; continue
        m = line_re.match(line)
        if not m:
            errors.append(f'{where}: not a sample line: {line!r}'); continue
        name, labels, value = m.group(1), m.group(2) or '', m.group(3)
        base = re.sub(r'_(bucket|sum|count)$', '', name)
        family = name if name in types else base if types.get(base) == 'histogram' else None
        if family is None:
            errors.append(f'{where}: {name} has no TYPE line'); continue
        try:
            v = float(value)
        except ValueError:
            errors.append(f'{where}: value {value!r}'); continue
        samples.setdefault((daemon, name), []).append((labels, v))
    # Histograms: cumulative buckets ending at +Inf equal to _count.
    for name, kind in types.items():
        if kind != 'histogram': continue
        buckets = samples.get((daemon, name + '_bucket'), [])
        by_series = {}
        for labels, v in buckets:
            key = re.sub(r'le="[^"]*",?', '', labels)
            by_series.setdefault(key, []).append((labels, v))
        for key, bs in by_series.items():
            vals = [v for _, v in bs]
            if vals != sorted(vals): errors.append(f'{daemon}: {name}{key} buckets not cumulative')
            if 'le="+Inf"' not in bs[-1][0]: errors.append(f'{daemon}: {name}{key} does not end at +Inf')
            counts = [v for l, v in samples.get((daemon, name + '_count'), [])
                      if re.sub(r'[{}]', '', l) == re.sub(r'[{},]', '', key).strip()]
            if counts and counts[0] != vals[-1]:
                errors.append(f'{daemon}: {name}{key}: +Inf bucket {vals[-1]} != count {counts[0]}')

def value(daemon, name, label=''):
    vals = [v for l, v in samples.get((daemon, name), []) if label in l]
    return vals[0] if vals else None
def need(ok, what):
    if not ok: errors.append(what)
for w in ('worker-0', 'worker-1'):
    need((value(w, 'strata_worker_push_seconds_count') or 0) > 0, f'{w}: no push latencies')
    need((value(w, 'strata_worker_pull_seconds_count') or 0) > 0, f'{w}: no pull latencies')
    s, c = value(w, 'strata_worker_push_seconds_sum'), value(w, 'strata_worker_push_seconds_count')
    need(s is not None and c and 0 < s / c < 5, f'{w}: mean push latency {s}/{c} not in (0, 5) s')
    need((value(w, 'strata_worker_push_bytes_total') or 0) > 1e5, f'{w}: push bytes')
    need((value(w, 'strata_worker_pull_bytes_total') or 0) > 1e5, f'{w}: pull bytes')
    for phase in ('compute', 'wait'):
        need((value(w, 'strata_worker_step_seconds_count', f'phase="{phase}"') or 0) > 0,
             f'{w}: no {phase} step times')
    need((value(w, 'strata_worker_samples_per_second') or 0) > 0, f'{w}: samples/s')
    c = value(w, 'strata_worker_comm_share')
    need(c is not None and 0 <= c <= 1, f'{w}: comm share {c}')
for p in ('pserver-0', 'pserver-1'):
    need((value(p, 'strata_pserver_apply_seconds_count') or 0) > 0, f'{p}: no apply times')
    need(value(p, 'strata_pserver_apply_queue_depth') is not None, f'{p}: no queue depth')
for d in ('master-0', 'pserver-0', 'worker-0'):
    rss = value(d, 'process_resident_memory_bytes')
    need(rss is not None and 1e6 < rss < 64e9, f'{d}: resident memory {rss}')
    need((value(d, 'process_cpu_seconds_total') or 0) > 0, f'{d}: cpu seconds')
ages = samples.get(('master-0', 'strata_master_heartbeat_age_seconds'), [])
need(len(ages) == 4 and all(0 <= v < 5 for _, v in ages), f'master: heartbeat ages {ages}')
need(len(samples.get(('master-0', 'strata_master_node_up'), [])) == 4, 'master: node_up series')
need((value('master-0', 'strata_master_checkpoint_seconds_count') or 0) >= 1, 'master: no checkpoint times')
need((value('master-0', 'strata_master_checkpoint_bytes_sum') or 0) > 1e5, 'master: checkpoint bytes')

# The dashboard names only exported metrics.
dash = json.load(open(dashboard))
exported = set(families)
for n, k in families.items():
    if k == 'histogram': exported |= {n + '_bucket', n + '_sum', n + '_count'}
words = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*')
panels = dash['panels']
need(len(panels) >= 8, f'dashboard has {len(panels)} panels')
for p in panels:
    need(p.get('targets'), f'panel {p.get("title")}: no queries')
    for t in p.get('targets', []):
        expr = re.sub(r'\{[^}]*\}', '', t['expr'])      # label matchers
        expr = re.sub(r'\[[^\]]*\]', '', expr)            # ranges
        expr = re.sub(r'by \([^)]*\)', '', expr)          # grouping labels
        names = [w for w in words.findall(expr) if w.startswith(('strata_', 'process_'))]
        need(names, f'panel {p["title"]}: query names no Strata metric: {t["expr"]}')
        for w in names:
            need(w in exported, f'panel {p["title"]}: {w} is not exported')
print(f'{len(families)} metric families; {len(panels)} dashboard panels checked')
for e in errors: print('ERROR', e)
sys.exit(1 if errors else 0)
PY
  { cat "$work/check.out"; fail "metrics check failed"; }
cat "$work/check.out"

if ! command -v prometheus > /dev/null; then
  "$ROOT/scripts/launch.sh" down --run-dir "$work/run" > /dev/null
  assert_nothing_left "$work"
  echo "PASS (metrics and dashboard); the Prometheus part skipped: prometheus is not installed"
  exit 0
fi
"$STRATA" prometheus-config --config "$work/job.yaml" --hosts "$work/hosts" --interval 1s \
  > "$work/prometheus.yml" || fail "strata prometheus-config failed"
if command -v promtool > /dev/null; then
  promtool check config "$work/prometheus.yml" > "$work/promtool.out" 2>&1 ||
    { cat "$work/promtool.out"; fail "promtool rejects the generated config"; }
fi
prom_port=$((base + 50))
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" > "$work/prometheus.log" 2>&1 &
prom_pid=$!
api() { curl -sf "http://127.0.0.1:$prom_port/api/v1/$1" --data-urlencode "query=$2"; }
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$prom_port/-/ready" > /dev/null 2>&1 && break
  kill -0 "$prom_pid" 2>/dev/null || { cat "$work/prometheus.log"; fail "prometheus exited"; }
  sleep 0.1
done
# A few scrapes (1 s apart) so that rates have two points.
sleep 6
python3 - "$prom_port" "$ROOT/conf/grafana/strata.json" "e2e-bsp" > "$work/prom.out" 2>&1 <<'PY' ||
import json, sys, time, urllib.parse, urllib.request
port, dashboard, job = sys.argv[1], sys.argv[2], sys.argv[3]
def query(q):
    url = f'http://127.0.0.1:{port}/api/v1/query?' + urllib.parse.urlencode({'query': q})
    r = json.load(urllib.request.urlopen(url, timeout=10))
    if r['status'] != 'success': raise RuntimeError(f'{q}: {r}')
    return r['data']['result']
errors = []
def need(ok, what):
    if not ok: errors.append(what)
up = query('up')
need(len(up) == 5 and all(float(s['value'][1]) == 1 for s in up), f'up: {up}')
need({s['metric'].get('role') for s in up} == {'master', 'pserver', 'worker'}, 'roles of the targets')
steps = query('strata_worker_steps')
need(len(steps) == 2 and all(float(s['value'][1]) > 0 for s in steps), f'worker steps: {steps}')
# A rate needs two scrapes in its window: on a loaded machine a scrape can
# be late, so the window is wide and the query is asked again for a while.
for _ in range(20):
    p90 = query('histogram_quantile(0.9, sum by (le) (rate(strata_worker_push_seconds_bucket[10s])))')
    if p90 and float(p90[0]['value'][1]) > 0: break
    time.sleep(0.5)
need(p90 and 0 < float(p90[0]['value'][1]) < 10, f'push latency p90: {p90}')
rss = query('process_resident_memory_bytes{role="pserver"}')
need(len(rss) == 2 and all(float(s['value'][1]) > 1e6 for s in rss), f'pserver memory: {rss}')
sps = query('sum(strata_worker_samples_per_second)')
need(sps and float(sps[0]['value'][1]) > 0, f'samples/s: {sps}')
# Every dashboard query evaluates, and the job variable selects this job.
dash = json.load(open(dashboard))
n = 0
for p in dash['panels']:
    for t in p['targets']:
        try:
            query(t['expr'].replace('$job', job)); n += 1
        except Exception as e:
            errors.append(f'panel {p["title"]}: {e}')
values = query('count(strata_master_view_epoch{strata_job="%s"})' % job)
need(values and float(values[0]['value'][1]) == 1, f'the job label: {values}')
print(f'prometheus: 5 targets up; {n} dashboard queries evaluated')
for e in errors: print('ERROR', e)
sys.exit(1 if errors else 0)
PY
  { cat "$work/prom.out"; tail -20 "$work/prometheus.log"; fail "the Prometheus check failed"; }
cat "$work/prom.out"
kill "$prom_pid"; wait "$prom_pid" 2>/dev/null || true; prom_pid=""
"$ROOT/scripts/launch.sh" down --run-dir "$work/run" > /dev/null
assert_nothing_left "$work"
echo "PASS: metrics, dashboard and a real Prometheus"

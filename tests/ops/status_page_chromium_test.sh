#!/usr/bin/env bash
# The master's status page (GET /) in a real browser: Debian's headless
# Chromium loads it from a running local cluster (1 master, 2 pservers,
# 2 workers). The page as Chromium parsed it must show every node, the
# partitions and three SVG charts with their lines; the screenshot must
# have the charts' line colours in it (so they were drawn, not just
# present). The screenshot is kept as the test's output:
# BUILD_DIR/test-output/status_page.png (and status_page_stopped.png).
BUILD_DIR="$1"
source "$(dirname "$0")/../e2e/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
CHROMIUM="$(command -v chromium || command -v chromium-browser || true)"
[[ -n $CHROMIUM ]] || skip "chromium is not installed (scripts/install-deps.sh installs it)"

work="$(mktemp -d /tmp/strata-page-XXXXXX)"
trap '"$ROOT/scripts/launch.sh" down --run-dir "$work/run" > /dev/null 2>&1 || true; pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
out="$BUILD_DIR/test-output"
mkdir -p "$out"
base="$(pick_port_base)"
write_config "$work/job.yaml" bsp 50 "$base"
printf '127.0.0.1 master pserver=2 worker=2\n' > "$work/hosts"
"$ROOT/scripts/launch.sh" up --config "$work/job.yaml" --hosts "$work/hosts" \
  --run-dir "$work/run" --bin-dir "$BUILD_DIR/bin" > "$work/up.out" 2>&1 ||
  { cat "$work/up.out"; fail "launch.sh up failed"; }
master="127.0.0.1:$base"
page="http://127.0.0.1:$((base + 1))/?refresh=0"

# Wait for a few points of history (one about every 0.5 s).
points=0
for _ in $(seq 60); do
  points="$(curl -sf "http://127.0.0.1:$((base + 1))/status" |
            python3 -c 'import json,sys; print(len(json.load(sys.stdin)["job"]["history"]))' 2>/dev/null || echo 0)"
  (( points >= 4 )) && break
  sleep 0.5
done
(( points >= 4 )) || fail "the master's history has $points points after 30 s"

chrome() {  # chrome ARGS... URL: headless, offline, its own profile
  timeout 90 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --no-first-run --disable-extensions --disable-background-networking \
    --disable-component-update --disable-breakpad --disable-crash-reporter --hide-scrollbars --user-data-dir="$work/chrome" "$@" \
    2> "$work/chrome.err"
}

chrome --dump-dom "$page" > "$work/dom.html" ||
  { tail -20 "$work/chrome.err"; fail "chromium could not load $page"; }
python3 - "$work/dom.html" <<'PY' || { head -c 3000 "$work/dom.html"; fail "the status page as Chromium parsed it is wrong"; }
import re, sys
dom = open(sys.argv[1]).read()
assert '<h1>Strata: e2e-bsp</h1>' in dom, 'no heading with the job\'s name'
assert re.search(r'id="job-state"[^>]*>running<', dom), 'job not shown running'
rows = re.findall(r'<tr class="node (\w+)">(.*?)</tr>', dom)
roles = sorted(r for r, _ in rows)
assert roles == ['master', 'pserver', 'pserver', 'worker', 'worker'], roles
for role, row in rows:
    assert '>alive<' in row, (role, row)
assert '5 of 5 alive' in dom
parts = re.findall(r'<table id="partitions-table">.*?</table>', dom, re.S)
assert parts and parts[0].count('<tr>') >= 2, 'no partitions'
assert 'pserver 0 (node' in parts[0] and 'pserver 1 (node' in parts[0], 'owners not named'
for chart in ('chart-loss', 'chart-accuracy', 'chart-throughput'):
    m = re.search(r'<svg id="%s".*?</svg>' % chart, dom, re.S)
    assert m, chart + ' missing'
    pts = re.search(r'class="series"[^>]*points="([^"]*)"', m.group(0))
    assert pts and len(pts.group(1).split()) >= 4, chart + ' has no line of >= 4 points'
assert '<script' not in dom
print('DOM: 5 nodes alive, partitions, 3 charts with lines')
PY

check_png() {  # check_png FILE: the three chart colours are drawn
  python3 - "$1" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
pos, idat, w = 8, b'', 0
while pos < len(data):
    n, kind = struct.unpack('>I4s', data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b'IHDR':
        w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
        assert depth == 8 and ctype in (2, 6), (depth, ctype)
        bpp = 3 if ctype == 2 else 4
    elif kind == b'IDAT':
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
counts = {'loss': 0, 'accuracy': 0, 'throughput': 0}
want = {'loss': (0x1f, 0x77, 0xb4), 'accuracy': (0x2c, 0xa0, 0x2c), 'throughput': (0xd6, 0x27, 0x28)}
i = 0
for _ in range(h):
    f = raw[i]; line = bytearray(raw[i + 1:i + 1 + stride]); i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]
        c = prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp):
        px = tuple(line[x:x + 3])
        for k, rgb in want.items():
            if all(abs(px[j] - rgb[j]) <= 6 for j in range(3)):
                counts[k] += 1
    prev = line
print('%s: %dx%d, chart pixels %s' % (sys.argv[1], w, h, counts))
for k, n in counts.items():
    assert n >= 40, '%s line not drawn (%d pixels of its colour)' % (k, n)
PY
}

rm -f "$out/status_page.png"
(cd "$work" && chrome --screenshot="$out/status_page.png" --window-size=1400,1500 "$page" > /dev/null) ||
  { tail -20 "$work/chrome.err"; fail "chromium could not take a screenshot"; }
[[ -s $out/status_page.png ]] || fail "no screenshot written"
check_png "$out/status_page.png" || fail "the screenshot does not show the charts"

# After `strata stop` the page shows the job stopped.
"$STRATA" stop --master "$master" --no-checkpoint > /dev/null || fail "strata stop failed"
chrome --dump-dom "$page" > "$work/dom2.html" || fail "chromium could not load the page again"
grep -qE 'id="job-state"[^>]*>stopped<' "$work/dom2.html" || fail "the page does not show the job stopped"
rm -f "$out/status_page_stopped.png"
(cd "$work" && chrome --screenshot="$out/status_page_stopped.png" --window-size=1400,1500 "$page" > /dev/null) ||
  fail "chromium could not take the second screenshot"

"$ROOT/scripts/launch.sh" down --run-dir "$work/run" > /dev/null
assert_nothing_left "$work"
echo "PASS: status page in Chromium; screenshots in $out/status_page.png, $out/status_page_stopped.png"

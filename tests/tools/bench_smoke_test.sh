#!/usr/bin/env bash
# strata-bench works and its --json output is one JSON object with the
# fields of docs/performance.md. A smoke test of the tool, not a
# measurement: tiny sizes, short windows, no figure is judged.
set -euo pipefail
BUILD="${1:?usage: bench_smoke_test.sh BUILD_DIR}"
out="$(mktemp /tmp/strata-bench-smoke.XXXXXX)"
trap 'rm -f "$out"' EXIT
timeout 120 "$BUILD/bin/strata-bench" --json --mode pushpull,push,apply --sizes 4K,64K \
  --seconds 0.2 --apply_floats 1048576 >"$out" 2>/dev/null
/usr/bin/python3 - "$out" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
keys = {"mode", "bytes", "workers", "servers", "transport", "gbps", "p50_us", "p99_us",
        "baseline_gbps", "baseline_p50_us", "ratio_gbps", "ratio_p50"}
res = doc["results"]
assert len(res) == 4, f"{len(res)} results, want 4 (2 modes x 2 sizes)"
for r in res:
    missing = keys - r.keys()
    assert not missing, f"result {r} lacks {missing}"
    assert r["mode"] in ("push", "pushpull") and r["bytes"] in (4096, 65536), r
    assert r["gbps"] > 0 and r["baseline_gbps"] > 0 and r["p50_us"] > 0, r
    assert abs(r["ratio_gbps"] - r["gbps"] / r["baseline_gbps"]) < 1e-3, r
apply = {a["optimizer"]: a for a in doc["apply"]}
assert set(apply) == {"sgd", "adam"}, apply
for a in apply.values():
    assert a["gbps"] > 0 and a["baseline_gbps"] > 0 and "ratio" in a, a
print("ok: strata-bench --json gave", len(res), "results and", len(apply), "apply figures")
PY

#!/usr/bin/env bash
# Strata's ring allreduce against PyTorch's gloo allreduce (issue 28's
# benchmark; docs/performance.md, "Allreduce"): the same number of
# processes on this host, one thread each, TCP on 127.0.0.1, the same
# buffer sizes, runs alternated (strata, gloo, strata, ...) and the median
# of each size's per-run medians taken. Prints each run's lines and a
# table: seconds per allreduce, bus GB/s, and gloo's time over Strata's
# (above 1: Strata is faster).
#   bench/allreduce_bench.sh [BUILD_DIR] [--ranks W] [--sizes 4K,...,64M] [--pairs N]
#                            [--iters N] [--chunk-kib K] [--max-chunks M]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="build"
ranks=4; sizes="4K,64K,256K,1M,4M,16M,64M"; pairs=3; iters=20; chunk=256; max_chunks=8
if [[ $# -gt 0 && $1 != --* ]]; then BUILD="$1"; shift; fi
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    --pairs) pairs="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --chunk-kib) chunk="$2"; shift 2 ;;
    --max-chunks) max_chunks="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "allreduce_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bin="$ROOT/$BUILD/bin/strata-allreduce-bench"
[[ $BUILD == /* ]] && bin="$BUILD/bin/strata-allreduce-bench"
[[ -x $bin ]] || { echo "allreduce_bench.sh: $bin not built (scripts/build.sh)" >&2; exit 1; }
/usr/bin/python3 -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null ||
  { echo "allreduce_bench.sh: /usr/bin/python3 has no torch with gloo (apt install python3-torch)" >&2; exit 1; }
out="$(mktemp /tmp/strata-allreduce-bench.XXXXXX)"
trap 'rm -f "$out"' EXIT
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $ranks ranks, chunks of $chunk KiB or more, at most $max_chunks a segment (0: no bound)"
for ((p = 0; p < pairs; ++p)); do
  "$bin" --ranks "$ranks" --sizes "$sizes" --iters "$iters" --chunk_kib "$chunk" --max_chunks "$max_chunks" | tee -a "$out"
  /usr/bin/python3 "$ROOT/bench/gloo_allreduce.py" --ranks "$ranks" --sizes "$sizes" --iters "$iters" |
    tee -a "$out"
done
/usr/bin/python3 - "$out" <<'PY'
import collections, json, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[(r["bytes"], r["impl"])].append(r["seconds"])
ranks = None
print("\n%10s %12s %12s %10s %10s %8s" % ("bytes", "strata s", "gloo s", "strata GB/s",
                                          "gloo GB/s", "gloo/strata"))
for size in sorted({b for b, _ in runs}):
    s = statistics.median(runs[(size, "strata")])
    g = statistics.median(runs[(size, "gloo")])
    print("%10d %12.6f %12.6f %10.3f %10.3f %8.2f" % (size, s, g, size / s / 1e9, size / g / 1e9, g / s))
PY

#!/usr/bin/env bash
# Calibrates and runs strata-scale-sim (docs/performance.md, "Scaling past
# one machine"): strata-bench measures here what a pserver's core applies
# (Adam) and what a TCP message of 4 KiB and 64 KiB costs end to end, and
# the model takes those; then the table at 8-256 nodes x 8 GPUs, RDMA at
# 100 Gb/s (and with --tcp, TCP at the measured host costs).
#   bench/scale_sim.sh [BUILD_DIR] [--tcp] [more strata-scale-sim flags]
set -euo pipefail
BUILD="${1:-build}"; shift || true
rdma=true
args=()
for a in "$@"; do
  if [[ "$a" == --tcp ]]; then rdma=false; else args+=("$a"); fi
done
calib="$(mktemp /tmp/strata-scale-calib.XXXXXX)"
trap 'rm -f "$calib"' EXIT
"$BUILD/bin/strata-bench" --json --mode pushpull,apply --sizes 4K,64K --seconds 1 > "$calib"
"$BUILD/bin/strata-scale-sim" --calibration "$calib" --rdma="$rdma" ${args[@]+"${args[@]}"}

#!/usr/bin/env bash
# Configures and builds Strata into build/ (binaries in build/bin/).
# Extra arguments go to cmake's configure step, e.g. -DSTRATA_WITH_CUDA=OFF.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${STRATA_BUILD_DIR:-$ROOT/build}"
JOBS="${STRATA_JOBS:-$(nproc)}"
cmake -S "$ROOT" -B "$BUILD" "$@" > "$BUILD.configure.log" 2>&1 || {
  cat "$BUILD.configure.log" >&2; exit 1; }
cmake --build "$BUILD" -j "$JOBS"

#!/usr/bin/env bash
# The whole test suite, from nothing: installs what is missing, builds, and
# runs every test with ctest (unit, in-process cluster, real-binary cluster
# tests). Extra arguments go to ctest (e.g. -R config, -L cluster).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/install-deps.sh"
"$ROOT/scripts/build.sh"
cd "${STRATA_BUILD_DIR:-$ROOT/build}"
exec ctest --output-on-failure --timeout 900 -j "${STRATA_TEST_JOBS:-2}" "$@"

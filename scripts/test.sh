#!/usr/bin/env bash
# The whole test suite, from nothing: installs what is missing, builds, and
# runs every test with ctest (unit, in-process cluster, real-binary cluster
# tests, and the Soft-RoCE guest of tests/rdma when QEMU is installed).
# Extra arguments go to ctest (e.g. -R config, -L cluster).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/install-deps.sh" --test
"$ROOT/scripts/build.sh" -DSTRATA_BUILD_TESTS=ON
cd "${STRATA_BUILD_DIR:-$ROOT/build}"
rc=0
ctest --output-on-failure --timeout 900 -j "${STRATA_TEST_JOBS:-2}" "$@" || rc=$?
# The Soft-RoCE harness's verdict: ctest prints a skip without its reason.
# (Its own part of the log: other tests print SKIP lines too.)
if line="$(sed -n '/^"rdma_vm_test" start time/,/^"rdma_vm_test" end time/p' \
             Testing/Temporary/LastTest.log 2>/dev/null |
           grep -E '^(SKIP: |run-vm-tests.sh: all phases)' | tail -n 1)" && [[ -n "$line" ]]; then
  echo "rdma_vm_test (Soft-RoCE guest): $line"
fi
# The whole suite also runs the fuzz targets, 15 s each (clang builds them
# in build-fuzz/ first): after ctest, so that they do not take the CPUs
# from the timing-sensitive cluster tests. Arguments select part of the
# suite: then not.
if [[ $# -eq 0 ]]; then
  "$ROOT/scripts/fuzz.sh" --seconds 15 || rc=1
fi
exit $rc

#!/bin/sh
# Runs inside the Soft-RoCE guest (as /share/run.sh, PID 1's child): makes
# rxe0 on a dummy netdev, then runs the project's RDMA checks with the
# host-built binaries and libraries from the share. Exit status: the number
# of failed checks.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export LD_LIBRARY_PATH=/share/lib
export STRATA_REQUIRE_RDMA=1   # a test that finds no device fails here
ulimit -l unlimited
[ -f /share/gtest_filter ] && export GTEST_FILTER="$(cat /share/gtest_filter)"
fails=0
check() {  # name command...
  name="$1"; shift
  echo "=== $name"
  if "$@"; then echo "=== $name: PASS"; else echo "=== $name: FAIL"; fails=$((fails + 1)); fi
}
modprobe dummy && ip link set lo up && ip link set dummy0 up &&
  ip addr add 192.168.77.1/24 dev dummy0 &&
  modprobe rdma_rxe && rdma link add rxe0 type rxe netdev dummy0 ||
  { echo "guest: cannot create rxe0"; exit 100; }

check "strata doctor finds rxe0 ready" sh -c \
  '/share/bin/strata doctor --config /share/job.yaml | tee /tmp/doctor.txt &&
   grep -q "rxe0 port 1 ACTIVE, Ethernet" /tmp/doctor.txt &&
   grep -q "gid\[1\] ::ffff:192.168.77.1 RoCE v2" /tmp/doctor.txt &&
   grep -q "RDMA: ready" /tmp/doctor.txt'
check "strata doctor names a low memlock limit and its fix" sh -c \
  'ulimit -l 64; /share/bin/strata doctor --config /share/job.yaml > /tmp/low.txt;
   rc=$?; cat /tmp/low.txt; [ $rc = 1 ] && grep -q "FAIL  memlock" /tmp/low.txt &&
   grep -q "ulimit -l unlimited" /tmp/low.txt'
for t in /share/tests/*; do
  check "$(basename "$t")" "$t"
done
echo "guest: $fails check(s) failed"
exit "$fails"

#!/bin/sh
# Runs inside each of two Soft-RoCE guests joined by a link (as /share/run.sh;
# the kernel command line says role=a or role=b): rxe0 on eth0, 10.0.0.1
# (a) and 10.0.0.2 (b). Both check `strata doctor`; then a RoCE transfer
# between the hosts: perftest's ib_write_bw, server in a, client in b (its
# result is the line the harness reports). Exit status: failed checks.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export LD_LIBRARY_PATH=/share/lib
export STRATA_REQUIRE_RDMA=1
ulimit -l unlimited
role=$(sed -n 's/.* role=\([ab]\).*/\1/p' /proc/cmdline)
case "$role" in a) me=10.0.0.1; peer=10.0.0.2 ;; b) me=10.0.0.2; peer=10.0.0.1 ;;
  *) echo "guest-pair: no role= on the kernel command line"; exit 100 ;; esac
fails=0
failed_names=""
# check NAME COMMAND...: as in guest-tests.sh, a failure's verdict line is
# followed by "=== why: " and the output's last lines.
check() {
  name="$1"; shift
  echo "=== [$role] $name"
  t0=$(date +%s)
  { "$@" 2>&1; echo $? >/tmp/check.rc; } | tee /tmp/check.out
  if [ "$(cat /tmp/check.rc)" = 0 ]; then
    echo "=== [$role] $name: PASS ($(( $(date +%s) - t0 )) s)"
    return 0
  fi
  fails=$((fails + 1)); failed_names="$failed_names '$name'"
  echo "=== [$role] $name: FAIL ($(( $(date +%s) - t0 )) s)"
  echo "=== why: $(grep -v '^[[:space:]]*$' /tmp/check.out | tail -n 3 | tr '\n' ' ' | cut -c1-400)"
}
modprobe virtio_net && ip link set lo up && ip link set eth0 up &&
  ip addr add "$me/24" dev eth0 && modprobe rdma_rxe &&
  rdma link add rxe0 type rxe netdev eth0 || { echo "guest-pair: cannot create rxe0 on eth0"; exit 100; }
# (The image has no ping: the client below retries until the server,
# which may boot later, listens.)

check "strata doctor on eth0" sh -c \
  "/share/bin/strata doctor | tee /tmp/doctor.txt && grep -q '::ffff:$me RoCE v2' /tmp/doctor.txt"
if [ "$role" = a ]; then
  # A server serves one client: listen again if an attempt broke off.
  serve() {
    n=0
    until timeout 120 ib_write_bw -d rxe0 -x 1 -F -s 1048576 -D 3; do
      n=$((n + 1)); [ $n -lt 5 ] || return 1
    done
  }
  check "ib_write_bw server" serve
else
  bw() {
    n=0
    until timeout 120 ib_write_bw -d rxe0 -x 1 -F -s 1048576 -D 3 "$peer" >/tmp/bw.txt 2>&1; do
      n=$((n + 1)); [ $n -lt 30 ] || { cat /tmp/bw.txt; return 1; }; sleep 1
    done
    cat /tmp/bw.txt
    # A row "1048576 <iterations> <peak> <average> <msg rate>" with iterations > 0.
    awk '$1 == 1048576 && $2 > 0 {found = 1; print "ib_write_bw 1 MiB between guests: " $4 " MB/s"} END {exit !found}' /tmp/bw.txt
  }
  check "ib_write_bw between the guests" bw
fi
# The training job across the link: master and pserver in a, the worker in
# b, over rdma (transport: rdma, so a TCP fallback would fail it).
printf '10.0.0.1 master pserver=1\n10.0.0.2 worker=1\n' >/tmp/hosts
if [ "$role" = a ]; then
  serve_job() {
    /share/bin/strata-master --config /share/job-rdma.yaml --hosts /tmp/hosts \
      --host 10.0.0.1 --summary /tmp/summary.json >/tmp/master.log 2>&1 &
    m=$!
    /share/bin/strata-pserver --config /share/job-rdma.yaml --master 10.0.0.1:7070 \
      --index 0 --host 10.0.0.1 >/tmp/pserver.log 2>&1 &
    p=$!
    /share/bin/strata wait --master 10.0.0.1:7070 --timeout 600 >/tmp/wait.txt 2>&1
    rc=$?
    kill $p $m 2>/dev/null; wait $p $m 2>/dev/null
    cat /tmp/summary.json 2>/dev/null
    if [ $rc != 0 ]; then  # the last lines are the reason the harness shows
      grep -hE '^[EW][0-9]{4}' /tmp/master.log /tmp/pserver.log | tail -n 3
      grep -h '"message"' /tmp/summary.json 2>/dev/null
    fi
    tail -n 3 /tmp/wait.txt
    [ $rc = 0 ] && grep -q '"state": "succeeded"' /tmp/summary.json &&
      awk -F': ' '/final_test_accuracy/ {a = $2 + 0} END {print "test accuracy " a; exit !(a > 0.5)}' \
        /tmp/summary.json
  }
  check "training job: master and pserver here, the worker in b" serve_job
else
  work_job() {
    /share/bin/strata-worker --config /share/job-rdma.yaml --master 10.0.0.1:7070 \
      --index 0 --host 10.0.0.2 >/tmp/worker.log 2>&1
    rc=$?
    grep -E "data connection to pserver|cannot|failed" /tmp/worker.log | head -n 5
    [ $rc = 0 ] || grep -E '^[EF][0-9]{4}' /tmp/worker.log | tail -n 2
    tail -n 2 /tmp/worker.log
    [ $rc = 0 ] && grep -q "data connection to pserver 10.0.0.1:[0-9]*: rdma$" /tmp/worker.log
  }
  check "training job: the worker here, over rdma to the pserver in a" work_job
fi
echo "guest-pair [$role]: $fails check(s) failed${failed_names:+:$failed_names}"
exit "$fails"

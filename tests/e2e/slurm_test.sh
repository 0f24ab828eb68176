#!/usr/bin/env bash
# Strata inside a Slurm allocation (scripts/slurm/; docs/operations.md,
# "Slurm"), against a real slurmctld and slurmd of Debian's slurm-wlm (and
# munged) that this test starts itself in a directory of its own, no
# systemd: sbatch runs scripts/slurm/strata.sbatch, which makes the host
# file from the allocation, runs the master in the batch step and every
# pserver and worker as a job step; `strata scale` grows the workers within
# the allocation through scripts/slurm/provider.sh (new steps) and shrinks
# them (their steps end); the job succeeds and the batch step exits 0.
BUILD_DIR="$1"
source "$(dirname "$0")/lib.sh"
[[ -f $FMNIST/train-images-idx3-ubyte.gz ]] || skip "dataset-fashion-mnist not installed"
for b in slurmctld slurmd munged sbatch srun scontrol; do
  command -v "$b" > /dev/null || skip "$b not installed (apt-get install slurm-wlm munge)"
done
[[ $(id -u) -eq 0 ]] || skip "slurmd runs job steps as any user: it needs root"
work="$(mktemp -d /tmp/strata-e2e-slurm-XXXXXX)"
slurm_down() {
  local f
  for f in "$work"/slurm/*.pid; do [[ -f "$f" ]] && kill -TERM "$(cat "$f")" 2>/dev/null || true; done
  sleep 0.5
  for f in "$work"/slurm/*.pid; do [[ -f "$f" ]] && kill -KILL "$(cat "$f")" 2>/dev/null || true; done
}
trap 'slurm_down; pkill -KILL -f -- "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
base="$(pick_port_base)"
s="$work/slurm"
mkdir -p "$s"/{state,spool,log} "$s/munge"
head -c 1024 /dev/urandom > "$s/munge/munge.key"
chmod 400 "$s/munge/munge.key"
munged -f --socket="$s/munge/sock" --key-file="$s/munge/munge.key" --log-file="$s/log/munged.log" \
  --pid-file="$s/munged.pid" --seed-file="$s/munge/seed" || fail "munged did not start"
node="$(hostname -s)"
cat > "$s/slurm.conf" <<EOF
ClusterName=strata-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$((base + 50))
SlurmdPort=$((base + 51))
AuthType=auth/munge
AuthInfo=socket=$s/munge/sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd.pid
SlurmctldLogFile=$s/log/slurmctld.log
SlurmdLogFile=$s/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$node NodeAddr=127.0.0.1 CPUs=16 Sockets=1 CoresPerSocket=16 ThreadsPerCore=1 RealMemory=2000 State=UNKNOWN
PartitionName=strata Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:16
EOF
export SLURM_CONF="$s/slurm.conf"
slurmctld -c -i || fail "slurmctld did not start: $(tail -n 5 "$s/log/slurmctld.log")"
slurmd -c -N "$node" || fail "slurmd did not start: $(tail -n 5 "$s/log/slurmd.log")"
for _ in $(seq 1 100); do
  sinfo -h -o '%t' 2>/dev/null | grep -qx idle && break
  sleep 0.2
done
sinfo -h -o '%t' | grep -qx idle ||
  fail "the Slurm node is not idle: $(sinfo 2>&1; tail -n 5 "$s/log/slurmctld.log" "$s/log/slurmd.log")"

write_config "$work/job.yaml" bsp 20 "$base" 0
master="127.0.0.1:$base"
job="$(cd "$ROOT" && sbatch --parsable -N1 -o "$work/batch.out" scripts/slurm/strata.sbatch \
  --config "$work/job.yaml" --pservers 2 --workers 1 --max-workers 3 --run-dir "$work/run" \
  --bin-dir "$BUILD_DIR/bin" --timeout 300)" || fail "sbatch failed"
echo "Slurm job $job"
wait_steps "$master" 50
steps() { squeue -h -s -j "$job" -o '%j' | sort | tr '\n' ' '; }
[[ "$(steps)" == "batch strata-pserver-0 strata-pserver-1 strata-worker-0 " ]] ||
  fail "the job's steps: '$(steps)'"

out="$("$STRATA" scale --master "$master" --workers 3)" || fail "scale to 3: $out"
echo "$out"
grep -q 'scale done (workers 1 -> 3: starting workers 1, 2)' <<< "$out" || fail "scale to 3: $out"
[[ "$(steps)" == "batch strata-pserver-0 strata-pserver-1 strata-worker-0 strata-worker-1 strata-worker-2 " ]] ||
  fail "the job's steps after growing: '$(steps)'"

out="$("$STRATA" scale --master "$master" --workers 1)" || fail "scale to 1: $out"
grep -q 'scale done (workers 3 -> 1: draining workers 2, 1)' <<< "$out" || fail "scale to 1: $out"
for _ in $(seq 1 50); do
  [[ "$(steps)" == "batch strata-pserver-0 strata-pserver-1 strata-worker-0 " ]] && break
  sleep 0.2
done
[[ "$(steps)" == "batch strata-pserver-0 strata-pserver-1 strata-worker-0 " ]] ||
  fail "the drained workers' steps did not end: '$(steps)'"

for _ in $(seq 1 600); do
  squeue -h -j "$job" 2>/dev/null | grep -q . || break
  sleep 0.2
done
squeue -h -j "$job" 2>/dev/null | grep -q . && fail "the Slurm job did not end"
cat "$work/batch.out"
grep -q "job e2e-bsp succeeded" "$work/batch.out" || fail "batch output: $(cat "$work/batch.out")"
[[ "$(json_field "$work/run/summary.json" state)" == succeeded ]] || fail "summary: $(cat "$work/run/summary.json")"
grep -q '^127.0.0.1 master pserver=2 worker=1..3$' "$work/run/hosts" ||
  fail "host file made from the allocation: $(cat "$work/run/hosts")"
echo "ok: a Strata job ran in a Slurm allocation and scaled 1 -> 3 -> 1 workers as job steps"

#!/usr/bin/env bash
# The master's provider in a Slurm allocation (scripts/slurm/strata.sbatch;
# docs/operations.md, "Slurm"): starts pservers and workers as job steps on
# the allocation's nodes.
#
#   provider.sh --run-dir D --action add|remove --role worker|pserver --indices I,J
#
# add: each instance of the job's host file (D/plan, or its room in
# D/plan.spare) becomes a step of its own, `srun --overlap` on its node,
# detached from this script (its pid in D/steps/ROLE-I.pid, its log in
# D/logs/ROLE-I.log). remove: the instances drained have exited and their
# steps ended; the allocation keeps its nodes (shrinking it is not done).
set -euo pipefail
die() { echo "provider.sh: $*" >&2; exit 2; }
RUN_DIR="" ACTION="" ROLE="" INDICES=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --run-dir) RUN_DIR="$2"; shift 2 ;;
    --action) ACTION="$2"; shift 2 ;;
    --role) ROLE="$2"; shift 2 ;;
    --indices) INDICES="$2"; shift 2 ;;
    *) die "unknown argument '$1'" ;;
  esac
done
[[ -f "$RUN_DIR/slurm.env" ]] || die "--run-dir of a job strata.sbatch started is required"
[[ -n "${SLURM_JOB_ID:-}" ]] || die "not inside the allocation (no SLURM_JOB_ID)"
[[ "$ROLE" == worker || "$ROLE" == pserver ]] || die "--role worker|pserver, got '$ROLE'"
# shellcheck disable=SC1091
source "$RUN_DIR/slurm.env"
case "$ACTION" in
  add) ;;
  remove) echo "provider.sh: $ROLE $INDICES drained; their steps have ended"; exit 0 ;;
  *) die "--action add|remove, got '$ACTION'" ;;
esac
for index in ${INDICES//,/ }; do
  row="$(cat "$RUN_DIR/plan" "$RUN_DIR/plan.spare" | awk -v r="$ROLE" -v i="$index" '$1 == r && $2 == i' | head -n 1)"
  [[ -n "$row" ]] || die "no $ROLE $index in the job's host file ($RUN_DIR/hosts)"
  read -r _ _ host port data_port http_port <<< "$row"
  node="$(awk -v a="$host" '$2 == a { print $1; exit }' "$RUN_DIR/nodes")"
  [[ -n "$node" ]] || die "no node of the allocation has address $host"
  args=(--config "$CONFIG" --master "$MASTER" --index "$index" --host "$host" --http_port "$http_port")
  [[ -n "$TLS" ]] && args+=(--tls_dir "$TLS/$host")
  [[ "$ROLE" == pserver ]] && args+=(--port "$port" --data_port "$data_port")
  setsid nohup srun --jobid="$SLURM_JOB_ID" --overlap -N1 -n1 -w "$node" --job-name="strata-$ROLE-$index" \
    --output="$RUN_DIR/logs/$ROLE-$index.log" --open-mode=append \
    "$BIN_DIR/strata-$ROLE" "${args[@]}" < /dev/null > /dev/null 2>&1 &
  echo $! > "$RUN_DIR/steps/$ROLE-$index.pid"
  echo "provider.sh: $ROLE $index started on $node ($host), step strata-$ROLE-$index"
done

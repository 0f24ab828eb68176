#!/usr/bin/env bash
# Brings a Strata cluster up or down from a job config and a host file.
#
#   scripts/launch.sh run    --config C --hosts H [--run-dir D] [--timeout S] [--resume R] [--systemd]
#   scripts/launch.sh up     --config C --hosts H [--run-dir D] [--resume R] [--systemd]
#   scripts/launch.sh status [--run-dir D]
#   scripts/launch.sh down   [--run-dir D]
#   scripts/launch.sh provide --run-dir D --action add|remove --role worker|pserver --indices I,J
#
# run = up, wait for the job to end (showing the workers' progress), down.
# It exits 0 only if the job succeeded (3 when it was stopped after a
# checkpoint: SIGTERM, `strata checkpoint --stop`), and leaves D/summary.json, the
# cluster's events (D/events.jsonl) and each daemon's log (D/logs/<role>-<index>.log). Nothing is left running when it
# ends, also when it is interrupted or a daemon fails.
#
# Hosts that are local (localhost, 127.x.y.z, ::1) run as local processes.
# Other hosts are reached with the remote command, "ssh -o BatchMode=yes" by
# default; --remote-cmd "CMD" (or STRATA_REMOTE_CMD) replaces it, e.g. a
# wrapper that enters a network namespace. The remote command is called as
# `CMD HOST 'shell command'`; binaries, the config, the host file and the
# data must be at the same paths there (a shared file system or an install).
#
# Options:
#   --run-dir D     logs, pid files, summary (default runs/<config name>-<time>)
#   --timeout S     give up (and fail) after S seconds (default 3600)
#   --bin-dir B     where the strata binaries are (default build/bin)
#   --remote-cmd C  command to run things on remote hosts
#   --remote-all    use the remote command for local hosts too
#   --quiet         do not stream the workers' progress lines
#   --trace         each worker writes a Chrome trace of its first 2000 steps
#                   to D/trace/worker-N.json (chrome://tracing, Perfetto)
#   --resume R      resume from a checkpoint: 'latest' (the newest good one
#                   under the config's checkpoint.dir) or a checkpoint directory
#   --restart-budget N  restarts of one daemon allowed per minute (default 3)
#   --tls-dir T     the cluster's certificates, made by scripts/gen-certs.sh
#                   cluster (T/HOST/ for each host, T/admin/ for this
#                   script's calls); by default, when the config's
#                   security.mode is mtls, a new set is made in D/tls.
#                   Each daemon gets --tls_dir T/HOST (with --systemd, T/HOST
#                   is installed as the config's security.tls_dir there).
#                   Then `strata ... --tls-dir T/admin` (or STRATA_TLS_DIR)
#                   reaches the cluster (docs/security.md).
#   --systemd       start the installed units on each host instead of
#                   processes (scripts/install.sh on every host first):
#                   strata-master.service, strata-pserver@I, strata-worker@I,
#                   with this job's config, host file and addresses put in
#                   /etc/strata there; systemd supervises them (Restart=
#                   on-failure). down stops the units and copies their
#                   journals to D/logs and the master's summary and event
#                   log to D (docs/operations.md). `strata scale` starts
#                   and stops units on the hosts with room through the
#                   master's own provider (lib/strata/provider), which up
#                   gives a key that may do only that (setup_provider).
#
# run supervises the daemons like systemd's Restart=on-failure: the master,
# a pserver or a worker that fails while the job runs is restarted after
# 0.1 s (doubling; the master carries on from RUN_DIR/master-state),
# at most N times a minute, then the run fails (docs/reliability.md).
#
# down sends SIGTERM: with checkpoints on, the job is checkpointed and
# stopped first (within checkpoint.grace_seconds), then SIGKILL.
#
# provide is the master's provider for `strata scale` (docs/operations.md,
# "Scaling"), unless the config names another (elastic.provider): up
# passes it to the master, which runs it to start (add) the instances of
# the host file's room (a range, e.g. worker=1..4) it picked, on their
# hosts, as up starts the others; run supervises them as well. remove (of
# instances drained, which exit by themselves) has nothing to release.
#
# STRATA_MASTER_FLAGS, STRATA_PSERVER_FLAGS, STRATA_WORKER_FLAGS: extra
# flags for those daemons (tests and debugging: --v=1, --failpoint=...).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The daemon wrapper sits beside this script (also where only the two are
# copied, as in the Soft-RoCE guests).
RUN_DAEMON="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/run-daemon.sh"
cmd="${1:-}"
[[ -n "$cmd" ]] && shift || true

ACTION="" ROLE="" INDICES=""  # provide
CONFIG="" HOSTS="" RUN_DIR="" TIMEOUT=3600 QUIET=0 REMOTE_ALL=0 RESUME="" TRACE="" SYSTEMD=0
TLS_DIR=""  # the certificates (mtls): --tls-dir, else RUN_DIR/tls
# Supervision (run): a failed pserver or worker is restarted after
# RESTART_DELAY_MS (doubling with each restart), at most RESTART_BURST times
# within RESTART_INTERVAL s; like systemd's RestartSec (100 ms by default
# there too), StartLimitBurst and StartLimitIntervalSec.
RESTART_DELAY_MS="${STRATA_RESTART_DELAY_MS:-100}" RESTART_BURST="${STRATA_RESTART_BURST:-3}"
RESTART_INTERVAL="${STRATA_RESTART_INTERVAL:-60}"
STARTED=0  # set once this invocation has started a daemon
BIN_DIR="${STRATA_BIN_DIR:-$ROOT/build/bin}"
REMOTE_CMD="${STRATA_REMOTE_CMD:-ssh -o BatchMode=yes}"
# What the installed units run (scripts/install.sh's default prefix).
SYSTEMD_STRATA="${STRATA_SYSTEMD_PREFIX:-/usr/local}/bin/strata"
SYSTEMD_UNITS="${STRATA_SYSTEMD_PREFIX:-/usr/local}/lib/strata/units"  # the provider's forced command

die() { echo "launch.sh: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed -n '/^#/p' | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) CONFIG="$2"; shift 2 ;;
    --hosts) HOSTS="$2"; shift 2 ;;
    --run-dir) RUN_DIR="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --bin-dir) BIN_DIR="$2"; shift 2 ;;
    --remote-cmd) REMOTE_CMD="$2"; shift 2 ;;
    --remote-all) REMOTE_ALL=1; shift ;;
    --quiet) QUIET=1; shift ;;
    --trace) TRACE=1; shift ;;
    --systemd) SYSTEMD=1; shift ;;
    --tls-dir) TLS_DIR="$2"; shift 2 ;;
    --resume) RESUME="$2"; shift 2 ;;
    --restart-budget) RESTART_BURST="$2"; shift 2 ;;
    --action) ACTION="$2"; shift 2 ;;
    --role) ROLE="$2"; shift 2 ;;
    --indices) INDICES="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

STRATA="$BIN_DIR/strata"
abspath() { (cd "$(dirname "$1")" && echo "$(pwd)/$(basename "$1")"); }

is_local() {
  [[ $REMOTE_ALL -eq 1 ]] && return 1
  case "$1" in
    localhost|LOCALHOST|127.*|::1) return 0 ;;
    *) return 1 ;;
  esac
}

# Runs a shell command on a host: locally with bash, else via REMOTE_CMD.
on_host() {
  local host="$1"; shift
  # The remote command gets no stdin: ssh would read the caller's (the
  # plan a loop is reading), and the loop would stop after one host.
  if is_local "$host"; then bash -c "$*"; else $REMOTE_CMD "$host" "$*" < /dev/null; fi
}

# on_host_in FILE HOST COMMAND: COMMAND on HOST with FILE as its stdin.
on_host_in() {
  local file="$1" host="$2"; shift 2
  if is_local "$host"; then bash -c "$*" < "$file"; else $REMOTE_CMD "$host" "$*" < "$file"; fi
}

master_address() { cat "$RUN_DIR/master.address"; }

# plan_masters PLAN: the plan's masters, "host:port,..." (one, or a leader
# and standbys: docs/reliability.md, "Master high availability"), the
# address the nodes and the CLI are given.
plan_masters() {
  awk '$1 == "master" { h = $3; if (h ~ /:/) h = "[" h "]"; printf "%s%s:%s", (n++ ? "," : ""), h, $4 }' <<< "$1"
}

# A bring-up's own id: with etcd the masters keep the job's state under
# keys of it (restarts keep it), so a new job never takes an earlier one's.
new_instance() { echo "$(date +%Y%m%d-%H%M%S)-$$"; }

# The certificates of an mtls config (docs/security.md): --tls-dir, or a
# set made for this run in RUN_DIR/tls; every host of the plan must have
# its directory there. Sets TLS_DIR and exports STRATA_TLS_DIR (the admin
# certificate) for this script's own strata calls; RUN_DIR/tls.dir keeps
# it for later calls (status, down).
setup_tls() {
  local plan="$1" h
  if [[ -z "$TLS_DIR" ]]; then
    TLS_DIR="$RUN_DIR/tls"
    if [[ ! -f "$TLS_DIR/admin/client.crt" ]]; then
      "$ROOT/scripts/gen-certs.sh" cluster --hosts "$HOSTS" --out "$TLS_DIR" > /dev/null ||
        die "cannot make the cluster's certificates (scripts/gen-certs.sh)"
      # This run's CA signs nothing more: its key is gone, so a host that can
      # read the run directory cannot mint certificates.
      rm -f "$TLS_DIR/ca/ca.key"
      echo "launch.sh: security.mode mtls: certificates made in $TLS_DIR (CLI: --tls-dir $TLS_DIR/admin)"
    fi
  fi
  TLS_DIR="$(cd "$TLS_DIR" 2>/dev/null && pwd)" || die "--tls-dir: no such directory"
  for h in $(awk '{print $3}' <<< "$plan" | sort -u); do
    [[ -f "$TLS_DIR/$h/ca.crt" ]] ||
      die "$TLS_DIR has no certificates of host $h (scripts/gen-certs.sh cluster --hosts $HOSTS --out $TLS_DIR)"
  done
  [[ -f "$TLS_DIR/admin/client.crt" ]] ||
    die "$TLS_DIR/admin has no client certificate for this script's calls (scripts/gen-certs.sh cluster ...)"
  echo "$TLS_DIR" > "$RUN_DIR/tls.dir"
  export STRATA_TLS_DIR="$TLS_DIR/admin"
}

# start_daemon ROLE INDEX HOST COMMAND...: starts it in the background on
# HOST under scripts/run-daemon.sh, logging to RUN_DIR/logs/ROLE-INDEX.log
# (appended: a restart keeps the earlier log), pid in RUN_DIR/pids/, exit
# status (once it ends) in RUN_DIR/exit/ROLE-INDEX. The command is kept in
# RUN_DIR/cmd/ for restarts.
start_daemon() {
  local role="$1" index="$2" host="$3"; shift 3
  local name="$role-$index"
  local log="$RUN_DIR/logs/$name.log"
  local quoted; quoted="$(printf '%q ' "$@")"
  local pid
  STARTED=1
  mkdir -p "$RUN_DIR/cmd"
  printf '%s\n%s\n' "$host" "$quoted" > "$RUN_DIR/cmd/$name"
  pid="$(on_host "$host" "mkdir -p '$RUN_DIR/logs' '$RUN_DIR/exit' '$RUN_DIR/trace' && rm -f '$RUN_DIR/exit/$name.pid' &&
    { OPENBLAS_NUM_THREADS=1 nohup bash '$RUN_DAEMON' '$RUN_DIR/exit/$name.pid' \
        '$RUN_DIR/exit/$name' '$log' $quoted > /dev/null 2>&1 < /dev/null & } &&
    for i in \$(seq 1 500); do [ -s '$RUN_DIR/exit/$name.pid' ] && break; sleep 0.01; done &&
    cat '$RUN_DIR/exit/$name.pid'")"
  [[ -n "$pid" ]] || die "cannot start $name on $host"
  echo "$host $pid" > "$RUN_DIR/pids/$name"
}

# The exit status of a daemon that ended (empty while unknown).
exit_status() {
  local name="$1" host
  read -r host _ < "$RUN_DIR/pids/$name"
  # (Empty, too, when the host cannot be reached: a master's host gone.)
  on_host "$host" "cat '$RUN_DIR/exit/$name' 2>/dev/null || true" 2>/dev/null || true
}

# restart_daemon NAME: starts it again with the command it was started with.
restart_daemon() {
  local name="$1" host quoted
  { read -r host; read -r quoted; } < "$RUN_DIR/cmd/$name"
  local role="${name%-*}" index="${name##*-}"
  on_host "$host" "echo '=== launch.sh: restarting $name ===' >> '$RUN_DIR/logs/$name.log'"
  eval "start_daemon '$role' '$index' '$host' $quoted"
}

# Polls the master until it answers (bounded).
wait_for_master() {
  local addr last="" f; addr="$(master_address)"
  for _ in $(seq 1 150); do
    if last="$("$STRATA" status --master "$addr" 2>&1 > /dev/null)"; then return 0; fi
    if [[ -f "$RUN_DIR/systemd" ]]; then
      if ! any_master_unit_active; then
        echo "launch.sh: strata-master.service failed during start-up; its journal:" >&2
        unit_journal master-0 | tail -n 20 >&2 || true
        return 1
      fi
    elif ! any_master_alive; then
      echo "launch.sh: the master exited during start-up; its log:" >&2
      tail -n 20 "$RUN_DIR/logs/master-0.log" >&2 || true
      return 1
    fi
    sleep 0.2
  done
  echo "launch.sh: master at $addr did not answer within 30 s: ${last:-no answer}" >&2
  # (What the masters said meanwhile: their logs, or their units' journals.)
  if [[ -f "$RUN_DIR/systemd" ]]; then
    for f in "$RUN_DIR"/units/master-*; do
      [[ -f "$f" ]] || continue
      echo "launch.sh: ${f##*/}'s journal ends:" >&2
      unit_journal "${f##*/}" | tail -n 8 >&2 || true
    done
  else
    for f in "$RUN_DIR"/logs/master-*.log; do
      [[ -f "$f" ]] || continue
      echo "launch.sh: ${f##*/} ends:" >&2
      tail -n 8 "$f" >&2 || true
    done
  fi
  return 1
}

# Whether a master of this run lives (several: a leader and standbys).
any_master_alive() {
  local f
  for f in "$RUN_DIR"/pids/master-*; do
    [[ -f "$f" ]] && daemon_alive "$f" && return 0
  done
  return 1
}

daemon_alive() {
  local f="$1" host pid
  [[ -f "$f" ]] || return 1
  read -r host pid < "$f"
  # A local check forks nothing: run polls it while the job trains.
  if is_local "$host"; then kill -0 "$pid" 2>/dev/null; else on_host "$host" "kill -0 $pid 2>/dev/null"; fi
}

# ---- --systemd: the installed units instead of processes ----

# RUN_DIR/units/NAME holds "HOST UNIT STARTED_UNIX_TIME" of a daemon
# started as a unit.
unit_active() {
  local host unit _since; read -r host unit _since < "$RUN_DIR/units/$1"
  on_host "$host" "systemctl is-active --quiet $unit"
}
# Whether a master unit of this run is active (several: a leader and
# standbys).
any_master_unit_active() {
  local f
  for f in "$RUN_DIR"/units/master-*; do
    [[ -f "$f" ]] && unit_active "${f##*/}" && return 0
  done
  return 1
}
unit_journal() {  # this run's journal of the unit (since it was started)
  local host unit since=""; read -r host unit since < "$RUN_DIR/units/$1"
  on_host "$host" "journalctl -u $unit --no-pager -o short-precise ${since:+--since '@$since'}"
}

up_systemd() {
  local plan="$1" role index host port data_port http_port h
  [[ -z "$RESUME" ]] || die "--resume with --systemd is not supported: put checkpoint.resume in the config"
  [[ -z "$TRACE" ]] || die "--trace with --systemd is not supported"
  # Where the units' daemons look for their certificates.
  SYSTEMD_TLS_DIR="$("$STRATA" security-config --config "$CONFIG" | awk '$1 == "tls_dir" { print $2 }')"
  # Each master host runs strata-master.service: one, or a leader and
  # standbys (with etcd, under this bring-up's own keys: STRATA_INSTANCE).
  local master master_hosts instance
  master="$(plan_masters "$plan")"
  master_hosts="$(awk '$1 == "master" { print $3 }' <<< "$plan")"
  instance="$(new_instance)"
  echo "$master" > "$RUN_DIR/master.address"
  read -r role index host port data_port http_port <<< "$(grep '^master ' <<< "$plan" | head -n 1)"
  echo "$host:$http_port" > "$RUN_DIR/master.http"
  mkdir -p "$RUN_DIR/units"
  touch "$RUN_DIR/systemd"
  STARTED=1
  # The host file's room, where `strata scale` starts more (the provider).
  "$STRATA" plan --config "$CONFIG" --hosts "$HOSTS" --spare > "$RUN_DIR/plan.spare" ||
    { rm -f "$RUN_DIR/systemd"; die "cannot plan the host file's room"; }
  local all_hosts
  all_hosts="$(cat "$RUN_DIR/plan" "$RUN_DIR/plan.spare" | awk '{print $3}' | sort -u)"
  # Every host (those with room too): Strata installed for systemd, none of
  # its units running, and this job's config, host file and addresses in
  # /etc/strata (sent over the remote command: no shared file system needed).
  local units_of_host
  for h in $all_hosts; do
    units_of_host="$(awk -v h="$h" '$3 == h { print ($1 == "master" ? "strata-master.service" : "strata-" $1 "@" $2 ".service") }' <<< "$plan" | tr '\n' ' ')"
    on_host "$h" "[ -f /etc/systemd/system/strata-master.service ] && command -v systemctl > /dev/null ||
        { echo 'Strata is not installed for systemd on $h: run scripts/install.sh install there' >&2; exit 1; }
      [ -x '$SYSTEMD_UNITS' ] ||
        { echo 'Strata on $h has no $SYSTEMD_UNITS (installed before strata scale came): run scripts/install.sh install there again' >&2; exit 1; }
      for u in $units_of_host; do
        if systemctl is-active --quiet \$u; then
          echo \"\$u is already running on $h: stop it first (launch.sh down, or systemctl stop \$u)\" >&2; exit 1
        fi
      done" || { rm -f "$RUN_DIR/systemd"; die "cannot start the units on $h"; }
    on_host_in "$CONFIG" "$h" "cat > /etc/strata/strata.yaml.new && chmod 0644 /etc/strata/strata.yaml.new &&
      mv /etc/strata/strata.yaml.new /etc/strata/strata.yaml" &&
    on_host_in "$HOSTS" "$h" "cat > /etc/strata/hosts.new && chmod 0644 /etc/strata/hosts.new &&
      mv /etc/strata/hosts.new /etc/strata/hosts" &&
    on_host "$h" "printf 'STRATA_MASTER=%s\\nSTRATA_HOST=%s\\nSTRATA_MASTER_HOST=%s\\nSTRATA_INSTANCE=%s\\n' '$master' '$h' '$h' '$instance' > /etc/strata/strata.env" ||
      { rm -f "$RUN_DIR/systemd"; die "cannot set up /etc/strata on $h"; }
    if [[ -f "$RUN_DIR/tls.dir" ]]; then
      # This host's certificates only (never the CA's key), the keys the
      # daemons' user's alone (mode 0600: they refuse anything wider).
      local tar; tar="$(mktemp)"
      tar -C "$TLS_DIR/$h" -cf "$tar" .
      on_host_in "$tar" "$h" "d='$SYSTEMD_TLS_DIR' && mkdir -p \"\$d\" && rm -f \"\$d\"/*.key &&
          tar --no-same-owner -C \"\$d\" -xf - && chown root:strata \"\$d\" \"\$d\"/*.crt &&
          chmod 0750 \"\$d\" && chmod 0644 \"\$d\"/*.crt && chown strata:strata \"\$d\"/*.key &&
          chmod 0600 \"\$d\"/*.key" ||
        { rm -f "$tar" "$RUN_DIR/systemd"; die "cannot install the certificates in $SYSTEMD_TLS_DIR on $h"; }
      rm -f "$tar"
    fi
  done
  setup_provider "$master_hosts" "$all_hosts" || { rm -f "$RUN_DIR/systemd"; die "cannot set up the master's provider"; }
  local failed=0
  # start_unit NAME HOST UNIT [SHELL BEFORE]
  start_unit() {
    local since; since="$(date +%s)"
    echo "$2 $3 $since" > "$RUN_DIR/units/$1"
    on_host "$2" "${4:+$4; }systemctl reset-failed $3 2>/dev/null; systemctl start $3" ||
      { echo "launch.sh: systemctl start $3 failed on $2" >&2; failed=1; }
  }
  # A new job: no state of an earlier one in a master's state directory,
  # and its own event log (the last one's kept beside it).
  while read -r role index host port data_port http_port; do
    [[ "$role" == master ]] || continue
    start_unit "master-$index" "$host" strata-master.service \
      "rm -rf /var/lib/strata/master /var/lib/strata/summary.json; if [ -f /var/log/strata/events.jsonl ]; then mv /var/log/strata/events.jsonl /var/log/strata/events.jsonl.1; fi"
  done <<< "$plan"
  if (( failed )) || ! wait_for_master; then
    do_down
    return 1
  fi
  while read -r role index host port data_port http_port; do
    case "$role" in
      pserver|worker) start_unit "$role-$index" "$host" "strata-$role@$index.service" ;;
    esac
  done <<< "$plan"
  if (( failed )); then
    echo "launch.sh: some units did not start (journalctl -u UNIT on their hosts); stopping the others" >&2
    do_down
    return 1
  fi
  echo "launch.sh: cluster up under systemd: master $master (http $(cat "$RUN_DIR/master.http")), run dir $RUN_DIR"
}

# setup_provider MASTER_HOST HOSTS: what the master's provider under
# systemd (scripts/systemd/provider.sh) needs to start and stop units on
# HOSTS for `strata scale`. A key made for this run (RUN_DIR/provider/id)
# is installed as /etc/strata/provider/id on the master's host, strata's
# alone; on every host, root's logins take it from /etc/strata/provider/
# authorized_keys (install.sh's sshd drop-in), where its command= lets it
# run lib/strata/units only. Each master's host (MASTER_HOSTS: whichever
# leads runs the provider) also gets the key, the hosts' ssh keys (no key
# is taken on trust) and the plan with the host file's room
# (/etc/strata/plan: which host runs which index).
setup_provider() {
  local master_hosts="$1" hosts="$2" h keys dir="$RUN_DIR/provider" master_host
  mkdir -p "$dir"
  [[ -f "$dir/id" ]] || ssh-keygen -q -t ed25519 -N '' -C "strata-provider ($RUN_DIR)" -f "$dir/id" ||
    { echo "launch.sh: ssh-keygen failed" >&2; return 1; }
  echo "restrict,command=\"$SYSTEMD_UNITS\" $(cat "$dir/id.pub")" > "$dir/authorized_keys"
  : > "$dir/known_hosts"
  for h in $hosts; do
    on_host_in "$dir/authorized_keys" "$h" "mkdir -p /etc/strata/provider && chmod 0755 /etc/strata/provider &&
        cat > /etc/strata/provider/authorized_keys.new && chmod 0644 /etc/strata/provider/authorized_keys.new &&
        mv /etc/strata/provider/authorized_keys.new /etc/strata/provider/authorized_keys" ||
      { echo "launch.sh: cannot install the provider's key on $h" >&2; return 1; }
    keys="$(on_host "$h" "cat /etc/ssh/ssh_host_*_key.pub")" && [[ -n $keys ]] ||
      { echo "launch.sh: cannot read $h's ssh host keys (/etc/ssh/ssh_host_*_key.pub): is sshd installed there?" >&2; return 1; }
    awk -v h="$h" '{ print h, $1, $2 }' <<< "$keys" >> "$dir/known_hosts"
  done
  cat "$RUN_DIR/plan" "$RUN_DIR/plan.spare" > "$dir/plan"
  for master_host in $master_hosts; do
    on_host_in "$dir/plan" "$master_host" "cat > /etc/strata/plan.new && chmod 0644 /etc/strata/plan.new &&
        mv /etc/strata/plan.new /etc/strata/plan" &&
    on_host_in "$dir/known_hosts" "$master_host" "cat > /etc/strata/provider/known_hosts.new &&
        chmod 0644 /etc/strata/provider/known_hosts.new &&
        mv /etc/strata/provider/known_hosts.new /etc/strata/provider/known_hosts" &&
    on_host_in "$dir/id" "$master_host" "umask 077 && cat > /etc/strata/provider/id.new &&
        chown strata:strata /etc/strata/provider/id.new && mv /etc/strata/provider/id.new /etc/strata/provider/id" ||
      { echo "launch.sh: cannot install the provider's key, the plan or the hosts' keys on $master_host" >&2; return 1; }
  done
}

# Pservers and workers the master's provider started (strata scale) that
# still run are this run's units too: down stops them and keeps their
# journals (since the master started).
adopt_provided_units() {
  local h u since="" name _h _u
  [[ -f "$RUN_DIR/units/master-0" ]] && read -r _h _u since < "$RUN_DIR/units/master-0"
  for h in $(cat "$RUN_DIR/plan" "$RUN_DIR/plan.spare" 2>/dev/null | awk '$1 != "master" { print $3 }' | sort -u); do
    for u in $(on_host "$h" "systemctl list-units --plain --no-legend --state=active,activating,failed \
        'strata-worker@*' 'strata-pserver@*'" | awk '{ print $1 }'); do
      [[ $u =~ ^strata-(worker|pserver)@([0-9]+)\.service$ ]] || continue
      name="${BASH_REMATCH[1]}-${BASH_REMATCH[2]}"
      [[ -f "$RUN_DIR/units/$name" ]] || echo "$h $u $since" > "$RUN_DIR/units/$name"
    done
  done
}

down_systemd() {
  local f name host unit since pat
  adopt_provided_units
  # Workers first, then pservers, then the masters; systemd sends SIGTERM
  # (a checkpoint first when they are on) and SIGKILL after TimeoutStopSec.
  # (The masters all at once: one by one, a standby stopped after the
  # leader would be elected and lead a job whose nodes are gone.)
  for pat in 'worker-*' 'pserver-*'; do
    for f in "$RUN_DIR"/units/$pat; do
      [[ -f "$f" ]] || continue
      read -r host unit since < "$f"
      on_host "$host" "systemctl stop $unit" || echo "launch.sh: systemctl stop $unit failed on $host" >&2
    done
  done
  local stops=()
  for f in "$RUN_DIR"/units/master-*; do
    [[ -f "$f" ]] || continue
    read -r host unit since < "$f"
    { on_host "$host" "systemctl stop $unit" || echo "launch.sh: systemctl stop $unit failed on $host" >&2; } &
    stops+=($!)
  done
  (( ${#stops[@]} == 0 )) || wait "${stops[@]}" || true
  # What they left: the journals, the master's summary and event log.
  for f in "$RUN_DIR"/units/*; do
    [[ -f "$f" ]] || continue
    name="${f##*/}"
    unit_journal "$name" > "$RUN_DIR/logs/$name.log" 2>&1 || true
  done
  # Each master's host has what that master wrote while it led: the
  # newest summary (the last leader's), the event logs merged in time
  # order, and each host's audit log whole (its chain runs across jobs):
  # RUN_DIR/audit.jsonl from master 0's host, audit-master-N.jsonl from
  # the others'.
  local newest=-1 mtime events=() audit
  for f in "$RUN_DIR"/units/master-*; do
    [[ -f "$f" ]] || continue
    name="${f##*/}"
    read -r host unit since < "$f"
    mtime="$(on_host "$host" "stat -c %Y /var/lib/strata/summary.json 2>/dev/null" 2>/dev/null)" || mtime=""
    if [[ -n "$mtime" ]] && (( mtime > newest )) &&
       on_host "$host" "cat /var/lib/strata/summary.json" > "$RUN_DIR/summary.json.tmp" 2>/dev/null; then
      mv "$RUN_DIR/summary.json.tmp" "$RUN_DIR/summary.json"
      newest="$mtime"
    fi
    rm -f "$RUN_DIR/summary.json.tmp"
    on_host "$host" "cat /var/log/strata/events.jsonl" > "$RUN_DIR/events.$name.jsonl" 2>/dev/null || true
    events+=("$RUN_DIR/events.$name.jsonl")
    audit="$RUN_DIR/audit.jsonl"
    [[ "$name" == master-0 ]] || audit="$RUN_DIR/audit-$name.jsonl"
    on_host "$host" "cat /var/log/strata/audit.jsonl" > "$audit" 2>/dev/null || true
  done
  if (( ${#events[@]} > 0 )); then
    # (Each line begins {"unix_ms": N, ...)
    sort -s -n -k2,2 "${events[@]}" > "$RUN_DIR/events.jsonl" 2>/dev/null || true
    rm -f "${events[@]}"
  fi
  rm -f "$RUN_DIR"/units/* "$RUN_DIR/systemd"
}

do_up() {
  [[ -n "$CONFIG" && -n "$HOSTS" ]] || die "up/run need --config and --hosts"
  [[ -x "$STRATA" ]] || die "$STRATA not found: build first (scripts/build.sh)"
  CONFIG="$(abspath "$CONFIG")"
  HOSTS="$(abspath "$HOSTS")"
  # A CTR job generates its data set first when it is missing (the
  # config's data.generate section; docs/ctr-data.md).
  if grep -Eq '^[[:space:]]*format:[[:space:]]*criteo' "$CONFIG"; then
    [[ -x "$BIN_DIR/strata-gen-ctr" ]] || die "$BIN_DIR/strata-gen-ctr not found: build first"
    "$BIN_DIR/strata-gen-ctr" --config "$CONFIG" || exit 2
  fi
  if [[ -z "$RUN_DIR" ]]; then
    RUN_DIR="$ROOT/runs/$(basename "$CONFIG" .yaml)-$(date +%Y%m%d-%H%M%S)"
  fi
  mkdir -p "$RUN_DIR/logs" "$RUN_DIR/pids"
  RUN_DIR="$(cd "$RUN_DIR" && pwd)"
  if compgen -G "$RUN_DIR/pids/*" > /dev/null || compgen -G "$RUN_DIR/units/*" > /dev/null; then
    die "$RUN_DIR already has a running cluster (launch.sh down --run-dir $RUN_DIR)"
  fi
  rm -f "$RUN_DIR/down"  # (an earlier cluster's `down`)
  # The files, the ports, and every host (reached as below, its ports
  # free, the RDMA preflight for the rdma transport) before anything starts.
  local remote_all=() tmp_validate strata_there
  [[ $REMOTE_ALL -eq 1 ]] && remote_all=(--remote-all)
  # The strata of the other hosts: this one's path, or the installed one
  # for --systemd (what the units run).
  strata_there="$(abspath "$STRATA")"
  [[ $SYSTEMD -eq 1 ]] && strata_there="$SYSTEMD_STRATA"
  tmp_validate="$(mktemp)"
  "$STRATA" validate --config "$CONFIG" --hosts "$HOSTS" --remote-cmd "$REMOTE_CMD" \
    --strata-path "$strata_there" ${remote_all[@]+"${remote_all[@]}"} > "$tmp_validate" 2>&1 ||
    { sed 's/^/launch.sh: validate: /' "$tmp_validate" >&2; rm -f "$tmp_validate"; exit 2; }
  rm -f "$tmp_validate"
  # A new job: no state of an earlier master here (a restart within this
  # run carries on from it; see supervision below).
  rm -rf "$RUN_DIR/summary.json" "$RUN_DIR/master-state"
  local plan; plan="$("$STRATA" plan --config "$CONFIG" --hosts "$HOSTS")" || exit 2
  echo "$plan" > "$RUN_DIR/plan"
  cp "$CONFIG" "$RUN_DIR/config.yaml"
  cp "$HOSTS" "$RUN_DIR/hosts"
  local security; security="$("$STRATA" security-config --config "$CONFIG")" || exit 2
  rm -f "$RUN_DIR/tls.dir"
  if grep -qx 'mode mtls' <<< "$security"; then
    setup_tls "$plan"
  else
    echo "launch.sh: security.mode plaintext: no TLS, no authentication on the control plane" >&2
  fi
  if [[ $SYSTEMD -eq 1 ]]; then
    up_systemd "$plan"
    return
  fi

  local role index host port data_port http_port
  # The masters: one, or a leader and standbys (docs/reliability.md,
  # "Master high availability"): the nodes and the CLI get them all.
  plan_masters "$plan" > "$RUN_DIR/master.address"
  # (The first master's page: a standby sends it to the leader's.)
  read -r role index host port data_port http_port <<< "$(grep '^master ' <<< "$plan" | head -n 1)"
  echo "$host:$http_port" > "$RUN_DIR/master.http"
  local resume_args=()
  if [[ -n "$RESUME" ]]; then
    [[ "$RESUME" == latest ]] && resume_args=(--resume latest) || resume_args=(--resume "$(abspath "$RESUME")")
  fi
  # What `provide` needs of this run (it may run on the master's host).
  {
    printf 'BIN_DIR=%q REMOTE_CMD=%q REMOTE_ALL=%q TRACE=%q CONFIG=%q HOSTS=%q\n' \
      "$BIN_DIR" "$REMOTE_CMD" "$REMOTE_ALL" "$TRACE" "$CONFIG" "$HOSTS"
    printf 'STRATA_PSERVER_FLAGS=%q STRATA_WORKER_FLAGS=%q\n' \
      "${STRATA_PSERVER_FLAGS:-}" "${STRATA_WORKER_FLAGS:-}"
  } > "$RUN_DIR/launch.env"
  "$STRATA" plan --config "$CONFIG" --hosts "$HOSTS" --spare > "$RUN_DIR/plan.spare" || exit 2
  # (No spaces in the provider's words: the master splits it at spaces.)
  local provider=()
  [[ "$RUN_DIR$ROOT" != *" "* ]] && provider=(--provider "$ROOT/scripts/launch.sh provide --run-dir $RUN_DIR --action {action} --role {role} --indices {indices}")
  # (With etcd the masters keep the job's state there, not in --state_dir.)
  local instance; instance="$(new_instance)"
  while read -r role index host port data_port http_port; do
    [[ "$role" == master ]] || continue
    start_daemon master "$index" "$host" "$BIN_DIR/strata-master" --config "$CONFIG" $(tls_args "$host") \
      --hosts "$HOSTS" --host "$host" --port "$port" --http_port "$http_port" \
      --summary "$RUN_DIR/summary.json" --state_dir "$RUN_DIR/master-state${index#0}" \
      --instance "$instance" \
      --event_log "$RUN_DIR/events.jsonl" --audit_log "$RUN_DIR/audit.jsonl" \
      ${provider[@]+"${provider[@]}"} ${resume_args[@]+"${resume_args[@]}"} ${STRATA_MASTER_FLAGS:-}
  done <<< "$plan"
  if ! wait_for_master; then
    do_down
    return 1
  fi
  while read -r role index host port data_port http_port; do
    [[ "$role" == master ]] || start_instance "$role" "$index" "$host" "$port" "$data_port" "$http_port"
  done <<< "$plan"
  echo "launch.sh: cluster up: master $(master_address) (http $(cat "$RUN_DIR/master.http")), run dir $RUN_DIR"
}

# tls_args HOST: the daemon's certificates (mtls).
tls_args() { [[ -f "$RUN_DIR/tls.dir" ]] && echo "--tls_dir $TLS_DIR/$1" || true; }

# start_instance ROLE INDEX HOST PORT DATA_PORT HTTP_PORT: a pserver or a
# worker of the plan, started as a process (start_daemon).
start_instance() {
  local role="$1" index="$2" host="$3" port="$4" data_port="$5" http_port="$6"
  local master; master="$(master_address)"
  case "$role" in
    pserver)
      start_daemon pserver "$index" "$host" "$BIN_DIR/strata-pserver" $(tls_args "$host") \
        --config "$CONFIG" --master "$master" --index "$index" --host "$host" \
        --port "$port" --data_port "$data_port" --http_port "$http_port" ${STRATA_PSERVER_FLAGS:-} ;;
    worker)
      start_daemon worker "$index" "$host" "$BIN_DIR/strata-worker" $(tls_args "$host") \
        --config "$CONFIG" --master "$master" --index "$index" --host "$host" \
        --http_port "$http_port" ${TRACE:+--trace "$RUN_DIR/trace/worker-$index.json"} \
        ${STRATA_WORKER_FLAGS:-} ;;
  esac
}

# The master's provider for `strata scale` (see the top): starts the
# instances of the plan (or of its room) it names.
do_provide() {
  [[ -n "$RUN_DIR" && -f "$RUN_DIR/launch.env" ]] ||
    die "provide needs --run-dir of a cluster launch.sh started as processes (under --systemd, the master's own provider, lib/strata/provider, starts the units)"
  [[ "$ROLE" == worker || "$ROLE" == pserver ]] || die "provide: --role worker|pserver, got '$ROLE'"
  # shellcheck disable=SC1091
  source "$RUN_DIR/launch.env"
  STRATA="$BIN_DIR/strata"
  case "$ACTION" in
    add) ;;
    remove)
      echo "launch.sh provide: $ROLE $INDICES drained; nothing to release for local or ssh hosts"
      return 0 ;;
    *) die "provide: --action add|remove, got '$ACTION'" ;;
  esac
  local index row started=0
  for index in ${INDICES//,/ }; do
    row="$(cat "$RUN_DIR/plan" "$RUN_DIR/plan.spare" 2>/dev/null | awk -v r="$ROLE" -v i="$index" '$1 == r && $2 == i' | head -n 1)"
    [[ -n "$row" ]] || die "provide: no $ROLE $index in the host file's plan ($RUN_DIR/plan, $RUN_DIR/plan.spare)"
    local role idx host port data_port http_port
    read -r role idx host port data_port http_port <<< "$row"
    start_instance "$role" "$idx" "$host" "$port" "$data_port" "$http_port"
    echo "launch.sh provide: started $role $idx on $host"
    started=$((started + 1))
  done
  (( started > 0 )) || die "provide: no --indices given"
}

do_down() {
  [[ -n "$RUN_DIR" && -d "$RUN_DIR/pids" ]] || die "down needs --run-dir of a cluster"
  # A `launch.sh run` supervising this cluster stops supervising (it
  # neither restarts what this stops nor waits for the job).
  touch "$RUN_DIR/down"
  if [[ -f "$RUN_DIR/systemd" ]]; then
    down_systemd
    return
  fi
  local f host pid wait_s=10 alive
  # With checkpoints on, SIGTERM first checkpoints and stops the job: give
  # it the grace period (plus a little) before SIGKILL.
  if [[ -f "$RUN_DIR/config.yaml" ]] && grep -q '^checkpoint:' "$RUN_DIR/config.yaml"; then
    local grace
    grace="$(sed -n 's/^[[:space:]]*grace_seconds:[[:space:]]*\([0-9]*\).*/\1/p' "$RUN_DIR/config.yaml" | head -n 1)"
    wait_s=$(( ${grace:-60} + 15 ))
  fi
  # Another Ctrl-C (or SIGTERM) while waiting: SIGKILL at once.
  local now=0
  trap 'now=1' INT TERM
  # Workers first, then pservers, then the master.
  for pat in 'worker-*' 'pserver-*' 'master-*'; do
    for f in "$RUN_DIR"/pids/$pat; do
      [[ -f "$f" ]] || continue
      read -r host pid < "$f"
      on_host "$host" "kill -TERM $pid 2>/dev/null; kill -CONT $pid 2>/dev/null" || true
    done
  done
  # One deadline for all of them, then SIGKILL whatever is left.
  local deadline=$(( SECONDS + wait_s ))
  while (( SECONDS < deadline && now == 0 )); do
    alive=0
    for f in "$RUN_DIR"/pids/*; do
      [[ -f "$f" ]] || continue
      if daemon_alive "$f"; then alive=1; break; fi
    done
    (( alive )) || break
    sleep 0.1
  done
  for f in "$RUN_DIR"/pids/*; do
    [[ -f "$f" ]] || continue
    read -r host pid < "$f"
    on_host "$host" "kill -KILL $pid 2>/dev/null; true" || true
    rm -f "$f"
  done
  trap - INT TERM
}

do_status() {
  [[ -n "$RUN_DIR" && -f "$RUN_DIR/master.address" ]] || die "status needs --run-dir of a cluster"
  "$STRATA" status --master "$(master_address)"
}

# Streams the job's progress to stdout until killed: one line for the whole
# job from the master (epoch, step, samples/s, loss, accuracy, time left),
# redrawn in place on a terminal and a line every 3 s otherwise; from the
# workers' logs only their evaluations and errors (each worker's own
# progress lines stay in its log).
stream_progress() {
  local redraw=()
  [[ -t 1 ]] && redraw=(--redraw)
  "$STRATA" wait --master "$(master_address)" --progress-only "${redraw[@]}" \
    --timeout "$TIMEOUT" 2>/dev/null &
  # The logs are in the hosts' journals under systemd.
  [[ -f "$RUN_DIR/systemd" ]] && { wait; return; }
  cd "$RUN_DIR/logs" && tail -n +1 -F worker-*.log 2>/dev/null |
    grep --line-buffered -E 'evaluation:|ERROR|^E[0-9]{4}' |
    sed -u -E 's/^[IWEF][0-9]{4,8} [0-9:.]+ +[0-9]+ [^]]+\] //'
}

do_run() {
  local progress_pid="" wait_pid="" bringup_pid="" rc=1
  cleanup() {
    trap - EXIT INT TERM
    if [[ -n "$bringup_pid" ]]; then
      pkill -P "$bringup_pid" 2>/dev/null || true
      kill "$bringup_pid" 2>/dev/null || true
      wait "$bringup_pid" 2>/dev/null || true
      bringup_pid=""
    fi
    if [[ -n "$wait_pid" ]]; then
      kill "$wait_pid" 2>/dev/null || true
      wait "$wait_pid" 2>/dev/null || true
      wait_pid=""
    fi
    if [[ -n "$progress_pid" ]]; then
      pkill -P "$progress_pid" 2>/dev/null || true
      kill "$progress_pid" 2>/dev/null || true
      wait "$progress_pid" 2>/dev/null || true
      progress_pid=""
    fi
    # Only a cluster this invocation started: never one found in --run-dir.
    if [[ $STARTED -eq 1 && -n "$RUN_DIR" && -d "$RUN_DIR/pids" ]]; then
      do_down || true
    fi
  }
  trap 'cleanup; exit 130' INT TERM
  trap cleanup EXIT
  local start=$SECONDS
  do_up || { echo "launch.sh: bring-up failed" >&2; exit 1; }
  if [[ $QUIET -eq 0 ]]; then
    # Bring-up's progress (pservers and workers registering, partitions
    # placed or restored from a checkpoint) until the job runs.
    ( "$STRATA" wait --master "$(master_address)" --until running --timeout "$TIMEOUT" 2>/dev/null |
        sed -u 's/^/launch.sh: /' ) &
    bringup_pid=$!
  fi
  if [[ $QUIET -eq 0 ]]; then
    stream_progress &
    progress_pid=$!
  fi
  local master; master="$(master_address)"
  # One `strata wait` watches the job (gRPC from one process); this loop
  # only checks that the daemons live, with shell builtins, so the launcher
  # takes next to no CPU from the job it runs.
  "$STRATA" wait --master "$master" --timeout "$TIMEOUT" > "$RUN_DIR/wait.txt" 2>&1 &
  wait_pid=$!
  local state="" f name dead="" restarts_total=0 ha=0
  (( $(grep -c '^master ' "$RUN_DIR/plan") > 1 )) && ha=1
  local -A restarts=() finished=()
  while true; do
    if [[ -f "$RUN_DIR/down" ]]; then
      # Taken down from outside (`launch.sh down`; before, the run waited
      # out its timeout on a master gone).
      echo "launch.sh: the cluster was taken down (launch.sh down --run-dir $RUN_DIR)" >&2
      rc=1
      break
    fi
    if ! kill -0 "$wait_pid" 2>/dev/null; then
      if wait "$wait_pid"; then
        rc=0
      else
        rc=1
        grep -q ' stopped' "$RUN_DIR/wait.txt" && rc=3
        sed 's/^/launch.sh: /' "$RUN_DIR/wait.txt" >&2
      fi
      wait_pid=""
      break
    fi
    # Workers may exit once the job runs (they leave when it is done, and
    # the master handles a dead one); before that, any exit is fatal.
    if [[ -z "$state" || "$state" == waiting ]]; then
      local now_state
      now_state="$("$STRATA" status --master "$master" --json 2>/dev/null |
                   sed -n 's/.*"state": "\([a-z]*\)".*/\1/p' | head -n 1)" || true
      # (Nothing while the master restarts: keep what we knew.)
      [[ -n "$now_state" ]] && state="$now_state"
    fi
    # A daemon that exits before the job runs (bad port, bad data) would
    # stall bring-up: that fails the run. Once it runs, a pserver or worker
    # that fails is restarted the way systemd's Restart=on-failure would
    # (docs/reliability.md): after a backoff, within a restart budget; a
    # worker that exits 0 has finished its part.
    dead=""
    for f in "$RUN_DIR"/pids/*; do
      [[ -f "$f" ]] || continue
      name="${f##*/}"
      # (A drained worker's index started again by `strata scale` is a new
      # daemon: its pid file changed.)
      [[ -n "${finished[$name]:-}" && "${finished[$name]}" == "$(cat "$f")" ]] && continue
      daemon_alive "$f" || { dead="$name"; break; }
    done
    if [[ -n "$dead" ]]; then
      local code="" _i
      for _i in $(seq 1 20); do  # the wrapper writes it right after the exit
        code="$(exit_status "$dead")"
        [[ -n "$code" ]] && break
        sleep 0.05
      done
      if [[ "$code" == 0 ]]; then
        # A daemon leaves as soon as the job is done, which `strata wait`
        # (polling every 250 ms) may not have seen yet: give it a moment.
        for _ in 1 2 3 4 5 6; do kill -0 "$wait_pid" 2>/dev/null && sleep 0.25; done
      fi
      if ! kill -0 "$wait_pid" 2>/dev/null; then continue; fi
      if [[ -z "$state" || "$state" == waiting ]] && [[ "$dead" != master-* ]]; then
        # (The job may have begun since the last look.)
        local fresh
        fresh="$({ "$STRATA" status --master "$master" --json 2>/dev/null || true; } |
                 sed -n 's/.*"state": "\([a-z]*\)".*/\1/p' | head -n 1)"
        [[ -n "$fresh" ]] && state="$fresh"
      fi
      # A master that recorded a state (nodes registered) is restartable:
      # it carries on from it.
      # Standby masters (several) keep the state in etcd: always.
      local restartable=0
      if [[ -n "$state" && "$state" != waiting ]] || [[ $ha -eq 1 && "$dead" == master-* ]]; then
        restartable=1
      elif [[ "$dead" == master-0 && ( -s "$RUN_DIR/master-state/snapshot" ||
                                        -s "$RUN_DIR/master-state/log" ) ]]; then
        restartable=1
      fi
      if (( ! restartable )); then
        echo "launch.sh: $dead exited (code ${code:-?}) before the job ran; its log ends:" >&2
        tail -n 5 "$RUN_DIR/logs/$dead.log" >&2 || true
        rc=1; break
      fi
      if [[ "$code" == 0 && "$dead" != master-* ]]; then
        finished[$dead]="$(cat "$RUN_DIR/pids/$dead")"
        continue
      fi
      # The restart budget: RESTART_BURST restarts per RESTART_INTERVAL s.
      local now_s=$SECONDS kept="" t n=0
      for t in ${restarts[$dead]:-}; do
        if (( now_s - t < RESTART_INTERVAL )); then kept+=" $t"; n=$((n + 1)); fi
      done
      if (( n >= RESTART_BURST )); then
        echo "launch.sh: $dead failed again (code ${code:-?}) after $n restart(s) in" \
          "$RESTART_INTERVAL s: restart budget spent, giving up; its log ends:" >&2
        tail -n 5 "$RUN_DIR/logs/$dead.log" >&2 || true
        if [[ $ha -eq 1 && "$dead" == master-* ]] && any_master_alive; then
          echo "launch.sh: the other masters carry on without $dead" >&2
          finished[$dead]="$(cat "$RUN_DIR/pids/$dead")"
          continue
        fi
        rc=1; break
      fi
      local delay_ms=$(( RESTART_DELAY_MS << n ))
      local delay; delay="$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
      echo "launch.sh: $dead failed (code ${code:-?}); restarting it in ${delay}s" \
        "(restart $((n + 1)) of $RESTART_BURST within ${RESTART_INTERVAL}s)" >&2
      sleep "$delay"
      kill -0 "$wait_pid" 2>/dev/null || continue
      [[ -f "$RUN_DIR/down" ]] && continue
      if [[ $ha -eq 1 && "$dead" == master-* ]]; then
        # A master whose host is gone cannot be started again there: the
        # others carry on (tried again after the next backoff).
        ( restart_daemon "$dead" ) ||
          echo "launch.sh: cannot restart $dead (its host unreachable?); the other masters carry on" >&2
      else
        restart_daemon "$dead"
      fi
      restarts[$dead]="$kept $SECONDS"
      restarts_total=$((restarts_total + 1))
    fi
    if (( SECONDS - start > TIMEOUT )); then
      echo "launch.sh: job did not finish within $TIMEOUT s" >&2
      rc=1; break
    fi
    sleep 0.25
  done
  sleep 0.3  # let the last progress lines through
  "$STRATA" status --master "$master" > "$RUN_DIR/status.txt" 2>&1 || true
  cleanup
  if [[ -f "$RUN_DIR/summary.json" ]]; then
    echo "launch.sh: summary ($RUN_DIR/summary.json):"
    grep -E '"(state|message|final_test_accuracy|final_test_auc|steps|samples_per_sec|comm_share|wall_seconds|train_seconds|checkpoints|checkpoint_bytes|last_checkpoint|resumed_from)"' \
      "$RUN_DIR/summary.json" | sed 's/^ */  /'
  else
    echo "launch.sh: no summary written; logs in $RUN_DIR/logs" >&2
    rc=1
  fi
  if [[ $rc -eq 0 ]]; then
    echo "launch.sh: job succeeded"
  elif [[ $rc -eq 3 ]]; then
    echo "launch.sh: job stopped after a checkpoint; go on with: launch.sh run --resume latest ..." >&2
  else
    echo "launch.sh: job FAILED" >&2
  fi
  exit $rc
}

# A later call on a running cluster (status, down): its certificates.
if [[ -n "$RUN_DIR" && -f "$RUN_DIR/tls.dir" && "$cmd" != run && "$cmd" != up ]]; then
  TLS_DIR="$(cat "$RUN_DIR/tls.dir")"
  export STRATA_TLS_DIR="$TLS_DIR/admin"
fi

case "$cmd" in
  run) do_run ;;
  up) do_up ;;
  down) do_down ;;
  status) do_status ;;
  provide) do_provide ;;
  ""|-h|--help|help) usage ;;
  *) die "unknown command '$cmd' (run, up, down, status, provide)" ;;
esac

#!/usr/bin/env bash
# What the master's provider may do on a host (docs/operations.md,
# "Scaling"): the forced command of its key's line in
# /etc/strata/provider/authorized_keys (`command="PREFIX/lib/strata/units",
# restrict`), so that key starts and stops Strata's pserver and worker
# units and nothing else. Installed as PREFIX/lib/strata/units; sshd runs
# it as root with the line the provider sent in SSH_ORIGINAL_COMMAND:
#
#   add|remove worker|pserver INDEX
set -uo pipefail
ETC="${STRATA_ETC:-/etc/strata}"
line="${SSH_ORIGINAL_COMMAND:-}"
if [[ ! $line =~ ^(add|remove)\ (worker|pserver)\ ([0-9]{1,6})$ ]]; then
  echo "strata units: refused '${line:0:200}': this key may only run 'add|remove worker|pserver INDEX'" >&2
  client="${SSH_CLIENT:-here}"
  logger -t strata-units "refused '${line:0:200}' from ${client%% *}" 2>/dev/null || true
  exit 2
fi
action="${BASH_REMATCH[1]}" role="${BASH_REMATCH[2]}" index="${BASH_REMATCH[3]}"
unit="strata-$role@$index.service"
host="$(hostname)"
case "$action" in
  add)
    [[ -f $ETC/strata.env ]] ||
      { echo "strata units: $host has no $ETC/strata.env (launch.sh up --systemd sets it up)" >&2; exit 1; }
    systemctl reset-failed "$unit" 2> /dev/null
    systemctl start "$unit" || { echo "strata units: systemctl start $unit failed on $host (journalctl -u $unit)" >&2; exit 1; }
    echo "started $unit" ;;
  remove)
    # A drained instance has exited 0 by now: this only makes sure.
    systemctl stop "$unit" || { echo "strata units: systemctl stop $unit failed on $host" >&2; exit 1; }
    echo "stopped $unit" ;;
esac

#!/usr/bin/env bash
# The master's provider under systemd (docs/operations.md, "Scaling"):
# strata-master.service passes it as --provider, so `strata scale` and the
# autoscaler start and stop units the way launch.sh's `provide` starts
# processes. Installed as PREFIX/lib/strata/provider; the master runs it,
# as user strata, as
#
#   provider add|remove worker|pserver I[,J...]
#
# For each index it finds the host in /etc/strata/plan (the plan and the
# host file's room, written there by `launch.sh up --systemd`) and asks that
# host over ssh, with the provider's key (/etc/strata/provider/id, strata's
# alone) and the hosts' keys (/etc/strata/provider/known_hosts), to start
# (add) or stop (remove) strata-ROLE@I.service. On the host, that key may
# run nothing but PREFIX/lib/strata/units (its authorized_keys line's
# command=), which does only that.
#
# A cluster not brought up by launch.sh has no plan or key here: the
# provider says so and leaves the units to the operator (exit 0), as the
# master does with no provider at all.
set -uo pipefail
ETC="${STRATA_ETC:-/etc/strata}"
die() { echo "strata provider: $*" >&2; exit 1; }

[[ $# -eq 3 ]] || die "usage: provider add|remove worker|pserver I[,J...] (got: $*)"
action="$1" role="$2" indices="$3"
[[ $action == add || $action == remove ]] || die "action add or remove, got '$action'"
[[ $role == worker || $role == pserver ]] || die "role worker or pserver, got '$role'"
[[ $indices =~ ^[0-9]+(,[0-9]+)*$ ]] || die "indices I[,J...], got '$indices'"
plan="$ETC/plan" key="$ETC/provider/id" known="$ETC/provider/known_hosts"
if [[ ! -f $plan || ! -f $key ]]; then
  echo "strata provider: no $plan or $key (the cluster was not brought up by launch.sh up --systemd):" \
    "$action strata-$role@{$indices}.service by hand" >&2
  exit 0
fi

failed=0
for index in ${indices//,/ }; do
  host="$(awk -v r="$role" -v i="$index" '$1 == r && $2 == i { print $3; exit }' "$plan")"
  if [[ -z $host ]]; then
    echo "strata provider: no $role $index in $plan: the host file has no room for it (a host line's range, e.g. $role=0..4)" >&2
    failed=1
    continue
  fi
  # (No shell on the far side: the key's command= reads this line.)
  if out="$(ssh -i "$key" -o IdentitiesOnly=yes -o BatchMode=yes -o ConnectTimeout=10 \
      -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$known" -o GlobalKnownHostsFile=/dev/null \
      -o LogLevel=ERROR -T "root@$host" "$action $role $index" 2>&1 < /dev/null)"; then
    echo "strata provider: $host: $out"
  else
    echo "strata provider: $action $role $index on $host failed: ${out:-ssh exited $?}" >&2
    failed=1
  fi
done
exit "$failed"

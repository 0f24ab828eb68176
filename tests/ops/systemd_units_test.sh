#!/usr/bin/env bash
# The systemd units and scripts/install.sh, without a running systemd:
#   - install.sh install --root puts binaries, units, example configs, docs,
#     state and log directories where they belong, with their modes; an
#     operator's edited config survives a second install; uninstall takes the
#     binaries and units away and keeps configs and state; --purge takes all;
#   - systemd-analyze verify passes every unit (templates as instance @0)
#     without a warning;
#   - systemd-analyze security --offline=true rates each unit's exposure at
#     most MAX_EXPOSURE (docs/operations.md states the bound);
#   - the properties the issue names are there (Restart=on-failure with a
#     start limit, LimitMEMLOCK=infinity, hardening, credentials through
#     LoadCredential=, nothing secret on a command line).
BUILD_DIR="$1"
source "$(dirname "$0")/../e2e/lib.sh"
MAX_EXPOSURE=2.0
command -v systemd-analyze > /dev/null || skip "systemd-analyze is not installed"

work="$(mktemp -d /tmp/strata-units-XXXXXX)"
trap 'rm -rf "$work"' EXIT
root="$work/root"
install_sh() { bash "$ROOT/scripts/install.sh" "$@" --root "$root" --bin-dir "$BUILD_DIR/bin"; }

install_sh install --no-user > "$work/install.out" || { cat "$work/install.out"; fail "install.sh install failed"; }
for b in strata strata-master strata-pserver strata-worker strata-gen-ctr; do
  [[ -x "$root/usr/local/bin/$b" ]] || fail "install did not put $b in /usr/local/bin"
done
units=(strata-master.service strata-pserver@.service strata-worker@.service)
for u in "${units[@]}"; do
  [[ -f "$root/etc/systemd/system/$u" ]] || fail "install did not put $u in /etc/systemd/system"
done
for f in strata.yaml hosts strata.env nftables-strata.nft; do [[ -f "$root/etc/strata/$f" ]] || fail "no /etc/strata/$f"; done
# The Python package, where it was built: importable from where it went.
if [[ -d "$BUILD_DIR/python/strata" ]]; then
  pyver="$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  pydir="$root/usr/local/lib/python$pyver/dist-packages"
  [[ -f "$pydir/strata/torch.py" ]] && ls "$pydir"/strata/_core*.so > /dev/null ||
    fail "install did not put the Python package in $pydir"
  PYTHONPATH="$pydir" /usr/bin/python3 -c 'import strata._core' ||
    fail "the installed Python package does not import"
fi
[[ -f "$root/usr/local/share/doc/strata/operations.md" ]] || fail "no docs installed"
mode() { stat -c %a "$1"; }
[[ $(mode "$root/etc/strata/credentials") == 700 ]] || fail "/etc/strata/credentials is not mode 0700"
[[ $(mode "$root/etc/strata/credentials/s3") == 600 ]] || fail "/etc/strata/credentials/s3 is not mode 0600"
[[ $(mode "$root/var/lib/strata") == 750 ]] || fail "/var/lib/strata is not mode 0750"
[[ $(mode "$root/var/log/strata") == 750 ]] || fail "/var/log/strata is not mode 0750"
# The installed config is a valid job config.
"$BUILD_DIR/bin/strata" validate --config "$root/etc/strata/strata.yaml" --hosts "$root/etc/strata/hosts" \
  > "$work/validate.out" 2>&1 || { cat "$work/validate.out"; fail "the installed example config does not validate"; }

# The master's provider under systemd and what its key may run on a host.
lib="$root/usr/local/lib/strata"
[[ -x $lib/provider && -x $lib/units ]] || fail "install did not put provider and units in /usr/local/lib/strata"
grep -qF -- '--provider "/usr/local/lib/strata/provider {action} {role} {indices}"' \
  "$root/etc/systemd/system/strata-master.service" || fail "the master unit does not pass its provider"
# sshd takes root's keys from /etc/strata/provider/authorized_keys too, and
# only root's (its drop-in read as Debian's sshd_config includes it).
drop="$root/etc/ssh/sshd_config.d/strata.conf"
[[ -f $drop ]] || fail "install did not put the sshd drop-in"
if [[ -x /usr/sbin/sshd ]]; then
  # (sshd -T wants its privilege separation directory, which only a started
  # ssh service makes: a fresh machine without systemd has none.)
  mkdir -p /run/sshd 2>/dev/null || true
  ssh-keygen -q -t ed25519 -N '' -f "$work/hostkey"
  printf 'Include %s\nHostKey %s\n' "$drop" "$work/hostkey" > "$work/sshd_config"
  # (Written to files first: grep -q ending the pipe early would kill
  # sshd with SIGPIPE, and pipefail take that for a failure.)
  /usr/sbin/sshd -T -f "$work/sshd_config" -C user=root,host=h,addr=10.0.0.1 > "$work/sshd-root.txt" 2>&1 ||
    { cat "$work/sshd-root.txt"; fail "sshd -T refused the config with the drop-in"; }
  grep -qix 'authorizedkeysfile .ssh/authorized_keys .ssh/authorized_keys2 /etc/strata/provider/authorized_keys' \
    "$work/sshd-root.txt" || fail "the sshd drop-in does not give root the provider's authorized_keys"
  /usr/sbin/sshd -T -f "$work/sshd_config" -C user=bob,host=h,addr=10.0.0.1 > "$work/sshd-bob.txt" 2>&1 ||
    { cat "$work/sshd-bob.txt"; fail "sshd -T refused the config with the drop-in"; }
  grep -qi 'authorizedkeysfile.*strata' "$work/sshd-bob.txt" && fail "the sshd drop-in applies to users other than root"
fi
# The key's forced command runs nothing but add|remove worker|pserver INDEX.
for line in '' 'add worker 1; reboot' 'add worker 1 && id' 'start worker 1' 'add master 0' \
            'add worker ../1' 'remove pserver 1 2' $'add worker 1\nid'; do
  rc=0; out="$(SSH_ORIGINAL_COMMAND="$line" STRATA_ETC="$root/etc/strata" "$lib/units" 2>&1)" || rc=$?
  [[ $rc -eq 2 && $out == *"refused"* ]] || fail "units did not refuse '$line': $out"
done
# The provider: bad arguments refused; no plan (not brought up by
# launch.sh): the operator starts the units, said so, exit 0; no room in
# the plan for the index: the host file named.
STRATA_ETC="$root/etc/strata" "$lib/provider" add worker '1;id' > "$work/prov.out" 2>&1 &&
  fail "the provider took indices '1;id'"
grep -q "indices I\[,J...\], got '1;id'" "$work/prov.out" || { cat "$work/prov.out"; fail "the provider's refusal does not say why"; }
STRATA_ETC="$root/etc/strata" "$lib/provider" add worker 3 > "$work/prov.out" 2>&1 ||
  { cat "$work/prov.out"; fail "the provider failed without a plan"; }
grep -q 'add strata-worker@{3}.service by hand' "$work/prov.out" || { cat "$work/prov.out"; fail "the provider without a plan does not say so"; }
mkdir -p "$work/etc/provider" && touch "$work/etc/provider/id"
printf 'master 0 10.0.0.1 7070 7071 7072\nworker 0 10.0.0.2 0 0 7080\n' > "$work/etc/plan"
STRATA_ETC="$work/etc" "$lib/provider" add worker 4 > "$work/prov.out" 2>&1 && fail "the provider started a worker with no room"
grep -q "no worker 4 in $work/etc/plan: the host file has no room for it" "$work/prov.out" ||
  { cat "$work/prov.out"; fail "the provider does not name the missing room"; }

# An operator's config survives a second install.
echo "# edited by the operator" >> "$root/etc/strata/strata.yaml"
install_sh install --no-user > /dev/null || fail "second install failed"
grep -q "edited by the operator" "$root/etc/strata/strata.yaml" || fail "a second install replaced the operator's config"

# --prefix moves the binaries and the units' ExecStart with them.
install_sh install --no-user --prefix /opt/strata > /dev/null || fail "install --prefix failed"
[[ -x "$root/opt/strata/bin/strata-master" ]] || fail "--prefix: no /opt/strata/bin/strata-master"
grep -q '^ExecStart=/opt/strata/bin/strata-master ' "$root/etc/systemd/system/strata-master.service" ||
  fail "--prefix: the master unit does not start /opt/strata/bin/strata-master"
grep -qF -- '--provider "/opt/strata/lib/strata/provider ' "$root/etc/systemd/system/strata-master.service" ||
  fail "--prefix: the master unit's provider is not /opt/strata/lib/strata/provider"
install_sh install --no-user > /dev/null  # back to /usr/local for the checks below

# Verify: templates through an instance; ExecStart pointed at the installed
# binaries (verify checks that they exist).
mkdir -p "$work/units"
for u in "${units[@]}"; do
  sed "s|/usr/local/bin/|$root/usr/local/bin/|g" "$root/etc/systemd/system/$u" > "$work/units/$u"
done
ln -s strata-pserver@.service "$work/units/strata-pserver@0.service"
ln -s strata-worker@.service "$work/units/strata-worker@0.service"
for u in strata-master.service strata-pserver@0.service strata-worker@0.service; do
  systemd-analyze verify "$work/units/$u" > "$work/verify.out" 2>&1 ||
    { cat "$work/verify.out"; fail "systemd-analyze verify $u failed"; }
  [[ ! -s "$work/verify.out" ]] || { cat "$work/verify.out"; fail "systemd-analyze verify $u warned"; }
  systemd-analyze security --offline=true "$work/units/$u" > "$work/security.out" 2>&1 || true
  level="$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$work/security.out")"
  [[ -n $level ]] || { cat "$work/security.out"; fail "no exposure level for $u"; }
  echo "$u: exposure $level (bound $MAX_EXPOSURE)"
  awk -v l="$level" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(l <= m) }' ||
    { grep '✗' "$work/security.out"; fail "$u: exposure $level is over $MAX_EXPOSURE"; }
  # --threshold makes systemd-analyze itself fail over the bound.
  systemd-analyze security --offline=true --threshold="$(awk -v m="$MAX_EXPOSURE" 'BEGIN { print m * 10 }')" \
    "$work/units/$u" > /dev/null 2>&1 || fail "systemd-analyze security --threshold refused $u"
done

# The properties the units must have.
has() {  # has UNIT KEY=VALUE
  grep -qxF "$2" "$work/units/$1" || fail "$1 lacks $2"
}
for u in "${units[@]}"; do
  for kv in User=strata Restart=on-failure StartLimitBurst=5 StartLimitIntervalSec=300 \
            NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes CapabilityBoundingSet= \
            "ReadWritePaths=/var/lib/strata /var/log/strata" \
            LoadCredential=s3:/etc/strata/credentials/s3 StateDirectory=strata LogsDirectory=strata; do
    has "$u" "$kv"
  done
  grep -E '^ExecStart=|^  ' "$work/units/$u" | grep -qiE 'secret|password|token|credentials' &&
    fail "$u: a secret on the command line"
done
for u in strata-pserver@.service strata-worker@.service; do
  has "$u" LimitMEMLOCK=infinity
  grep -q -- '--index %i' "$work/units/$u" || fail "$u: the instance is not the index"
done

# uninstall keeps configs and state; --purge does not.
touch "$root/var/lib/strata/keep-me"
install_sh uninstall > /dev/null || fail "uninstall failed"
[[ ! -e "$root/usr/local/bin/strata-master" ]] || fail "uninstall left strata-master"
[[ ! -e "${pydir:-/nonexistent}/strata" ]] || fail "uninstall left the Python package"
[[ ! -e "$root/etc/systemd/system/strata-master.service" ]] || fail "uninstall left the master unit"
[[ ! -e $lib && ! -e $drop ]] || fail "uninstall left lib/strata or the sshd drop-in"
[[ -f "$root/etc/strata/strata.yaml" && -f "$root/var/lib/strata/keep-me" ]] ||
  fail "uninstall removed configs or state"
install_sh uninstall --purge > /dev/null || fail "uninstall --purge failed"
[[ ! -e "$root/etc/strata" && ! -e "$root/var/lib/strata" && ! -e "$root/var/log/strata" ]] ||
  fail "uninstall --purge left configs, state or logs"
echo "PASS: units verified, exposure at most $MAX_EXPOSURE, install and uninstall"

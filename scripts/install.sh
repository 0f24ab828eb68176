#!/usr/bin/env bash
# Installs Strata on this host for systemd, or takes it away again.
#
#   scripts/install.sh install   [--bin-dir DIR] [--prefix /usr/local] [--root DIR] [--no-user]
#   scripts/install.sh uninstall [--prefix /usr/local] [--root DIR] [--purge]
#
# install puts
#   the daemons and the CLI         PREFIX/bin/strata{,-master,-pserver,-worker,-gen-ctr}
#   the Python package, when built  PREFIX/lib/python3.X/dist-packages/strata (Debian's
#   (build/python/strata)           python3 finds it there: docs/python.md)
#   the units                       /etc/systemd/system/strata-master.service,
#                                   strata-pserver@.service, strata-worker@.service
#   the master's provider under     PREFIX/lib/strata/provider, units; and
#   systemd (starts and stops units /etc/ssh/sshd_config.d/strata.conf (root's
#   on other hosts for strata scale) logins also take the provider's key from
#                                   /etc/strata/provider/authorized_keys)
#   example configs (never over     /etc/strata/strata.yaml, hosts, strata.env,
#   an operator's own)              credentials/s3 (S3 keys, mode 0600, in 0700)
#   the docs                        PREFIX/share/doc/strata/
#   state and logs (user strata)    /var/lib/strata, /var/log/strata (mode 0750)
# and makes the system user `strata` (unless --no-user). uninstall removes the
# binaries, units and docs; /etc/strata and /var/lib/strata stay unless
# --purge (checkpoints live there). --root DIR installs under DIR instead of /
# (a package build, or a test); systemctl is then not called.
# --bin-dir: where the built binaries are (default: build/bin).
set -euo pipefail
ROOT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "install.sh: $*" >&2; exit 1; }

[[ $# -ge 1 ]] || die "usage: install.sh install|uninstall [--bin-dir DIR] [--prefix P] [--root DIR] [--no-user] [--purge]"
ACTION="$1"; shift
BIN_DIR="$ROOT_DIR/build/bin" PREFIX=/usr/local DEST="" MAKE_USER=1 PURGE=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin-dir) BIN_DIR="$2"; shift 2 ;;
    --prefix) PREFIX="$2"; shift 2 ;;
    --root) DEST="${2%/}"; shift 2 ;;
    --no-user) MAKE_USER=0; shift ;;
    --purge) PURGE=1; shift ;;
    --help|-h) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1" ;;
  esac
done
[[ $PREFIX == /* ]] || die "--prefix must be an absolute path, got $PREFIX"
BINARIES=(strata strata-master strata-pserver strata-worker strata-gen-ctr)
UNITS=(strata-master.service strata-pserver@.service strata-worker@.service)
UNIT_DIR="$DEST/etc/systemd/system"
LIB="$DEST$PREFIX/lib/strata"
SSHD_CONF="$DEST/etc/ssh/sshd_config.d/strata.conf"
ETC="$DEST/etc/strata"
DOC="$DEST$PREFIX/share/doc/strata"
# The Python package built beside the binaries (STRATA_WITH_PYTHON), for
# Debian's python3.
PY_SRC="$BIN_DIR/../python/strata"
PY_VERSION="$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)"
PY_DIR="$DEST$PREFIX/lib/python${PY_VERSION}/dist-packages/strata"
# systemctl only on a live system booted with systemd.
live_systemd() { [[ -z $DEST && -d /run/systemd/system ]]; }

install_all() {
  for b in "${BINARIES[@]}"; do
    [[ -x "$BIN_DIR/$b" ]] || die "$BIN_DIR/$b is missing: build first (scripts/build.sh) or pass --bin-dir"
  done
  if [[ $MAKE_USER == 1 ]]; then
    if [[ -z $DEST ]]; then
      getent passwd strata > /dev/null ||
        useradd --system --user-group --home-dir /var/lib/strata --no-create-home \
          --shell /usr/sbin/nologin --comment "Strata parameter server" strata
    fi
  fi
  install -d -m 0755 "$DEST$PREFIX/bin" "$UNIT_DIR" "$DOC"
  for b in "${BINARIES[@]}"; do install -m 0755 "$BIN_DIR/$b" "$DEST$PREFIX/bin/$b"; done
  for u in "${UNITS[@]}"; do
    sed -e "s|/usr/local/bin/|$PREFIX/bin/|g" -e "s|/usr/local/lib/strata/|$PREFIX/lib/strata/|g" -e "s|/usr/local/share/doc/strata/|$PREFIX/share/doc/strata/|g" \
      "$ROOT_DIR/scripts/systemd/$u" > "$UNIT_DIR/$u.tmp"
    chmod 0644 "$UNIT_DIR/$u.tmp"
    mv "$UNIT_DIR/$u.tmp" "$UNIT_DIR/$u"
  done
  install -m 0644 "$ROOT_DIR"/docs/*.md "$DOC/"
  # The master's provider and what its key may run on each host.
  install -d -m 0755 "$LIB"
  install -m 0755 "$ROOT_DIR/scripts/systemd/provider.sh" "$LIB/provider"
  install -m 0755 "$ROOT_DIR/scripts/systemd/units.sh" "$LIB/units"
  if [[ -n $DEST || -d /etc/ssh ]]; then  # (a host without ssh gets none)
    install -d -m 0755 "$(dirname "$SSHD_CONF")"
    install -m 0644 "$ROOT_DIR/scripts/systemd/sshd-strata.conf" "$SSHD_CONF"
  fi
  if [[ -n $PY_VERSION && -d $PY_SRC ]]; then
    install -d -m 0755 "$PY_DIR"
    install -m 0644 "$PY_SRC"/*.py "$PY_DIR/"
    install -m 0644 "$PY_SRC"/_core*.so "$PY_DIR/"
  fi
  install -d -m 0755 "$ETC"
  install -d -m 0700 "$ETC/credentials"
  # The units load it as the systemd credential "s3" (LoadCredential= needs
  # the file): keys to fill in when checkpoints or data are in an object store.
  if [[ ! -e "$ETC/credentials/s3" ]]; then
    ( umask 077
      printf '%s\n' "# S3 keys for checkpoints or data in an object store (docs/storage.md)," \
        "# handed to the services as the systemd credential s3. Fill in and keep mode 0600:" \
        "# [default]" "# aws_access_key_id = ..." "# aws_secret_access_key = ..." \
        > "$ETC/credentials/s3" )
  fi
  # Examples: an operator's own files are never replaced.
  [[ -e "$ETC/strata.yaml" ]] || install -m 0644 "$ROOT_DIR/conf/systemd.yaml" "$ETC/strata.yaml"
  [[ -e "$ETC/hosts" ]] || install -m 0644 "$ROOT_DIR/conf/hosts.local" "$ETC/hosts"
  # The per-host connection cap for the host's firewall (loaded by the
  # operator: docs/operations.md).
  [[ -e "$ETC/nftables-strata.nft" ]] ||
    install -m 0644 "$ROOT_DIR/conf/nftables-strata.nft" "$ETC/nftables-strata.nft"
  [[ -e "$ETC/strata.env" ]] ||
    printf '%s\n' "# The masters' addresses (host:port, comma-separated), and this host's, for the units." \
      "STRATA_MASTER=127.0.0.1:7070" "STRATA_HOST=127.0.0.1" \
      "# A master host with several masters: its own master line's address (unset: the first's)," \
      "# and the bring-up whose state the masters keep in etcd (a new job, a new one)." \
      "STRATA_MASTER_HOST=" "STRATA_INSTANCE=" > "$ETC/strata.env"
  local owner=""
  if [[ -z $DEST ]] && getent passwd strata > /dev/null; then owner=strata:strata; fi
  for d in "$DEST/var/lib/strata" "$DEST/var/log/strata"; do
    install -d -m 0750 ${owner:+-o strata -g strata} "$d"
  done
  # The host's certificates (docs/security.md; launch.sh --systemd fills it
  # from gen-certs.sh's HOST/): readable by the daemons' group, the keys by
  # their user only.
  install -d -m 0750 ${owner:+-g strata} "$ETC/tls"
  if live_systemd; then
    systemctl daemon-reload
    # (sshd reads its drop-in again; not running: it reads it when it starts.)
    systemctl try-reload-or-restart ssh.service 2> /dev/null || true
  fi
  echo "installed Strata under ${DEST:-/} (binaries in $PREFIX/bin, units in /etc/systemd/system)"
  echo "next: edit /etc/strata/strata.yaml, hosts and strata.env; then"
  echo "  systemctl enable --now strata-master   (on the master's host)"
  echo "  systemctl enable --now strata-pserver@0 strata-worker@0   (on the others)"
}

uninstall_all() {
  if live_systemd; then
    systemctl disable --now strata-master.service 'strata-pserver@*.service' \
      'strata-worker@*.service' > /dev/null 2>&1 || true
  fi
  for b in "${BINARIES[@]}"; do rm -f "$DEST$PREFIX/bin/$b"; done
  for u in "${UNITS[@]}"; do rm -f "$UNIT_DIR/$u"; done
  rm -rf "$DOC" "$LIB"
  rm -f "$SSHD_CONF"
  [[ -n $PY_VERSION ]] && rm -rf "$PY_DIR"
  if [[ $PURGE == 1 ]]; then
    rm -rf "$ETC" "$DEST/var/lib/strata" "$DEST/var/log/strata"
    if [[ -z $DEST ]] && getent passwd strata > /dev/null; then userdel strata || true; fi
  fi
  if live_systemd; then
    systemctl daemon-reload
    systemctl try-reload-or-restart ssh.service 2> /dev/null || true
  fi
  echo "uninstalled Strata from ${DEST:-/}$([[ $PURGE == 1 ]] && echo ' (purged: configs, state and logs too)' || echo ' (kept /etc/strata, /var/lib/strata, /var/log/strata)')"
}

case "$ACTION" in
  install) install_all ;;
  uninstall) uninstall_all ;;
  *) die "unknown action $ACTION (install or uninstall)" ;;
esac

#!/usr/bin/env bash
# A real single-node Ceph for the storage tests, without systemd, on
# 127.0.0.1: one mon, one bluestore OSD on a sparse file, radosgw (S3) and
# an MDS with CephFS mounted by ceph-fuse. About 20 s to come up.
#
#   ceph.sh up DIR [PORT_BASE]   bring it up in DIR (torn down first if there)
#   ceph.sh down DIR             unmount, kill everything, remove DIR
#   ceph.sh rgw-stop DIR         SIGKILL radosgw (fault tests)
#   ceph.sh rgw-start DIR        start radosgw again and wait for it
#
# `up` leaves DIR/env for the tests to source:
#   CEPH_DIR, CEPH_CONF, S3_ENDPOINT, S3_CREDENTIALS (AWS format, mode 600),
#   S3CMD_CONFIG (for s3cmd -c), CEPHFS (the ceph-fuse mount point).
# Ports: mon PORT_BASE and +1, radosgw +2, OSD and MDS +10..+79. Exits 77
# (skip) with the reason, also left in DIR.skipped, when Ceph's packages are
# not installed.
set -uo pipefail

cmd=${1:?usage: ceph.sh up|down|rgw-stop|rgw-start DIR [PORT_BASE]}
D=${2:?usage: ceph.sh $cmd DIR}
BASE=${3:-17480}

say() { echo "ceph.sh: $*"; }
# The reason goes to DIR.skipped too, for the tests that use this Ceph.
skip() { echo "SKIP: $*"; echo "$*" > "$D.skipped"; exit 77; }
die() { echo "ceph.sh: $*" >&2; [[ -d "$D/log" ]] && tail -n 5 "$D"/log/*.log 2>/dev/null | tail -n 40 >&2; exit 1; }

# Waits up to $1 half-seconds for the command after it to succeed.
wait_for() {
  local n=$1; shift
  local i
  for ((i = 0; i < n; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  return 1
}

down() {
  [[ -d "$D" ]] || return 0
  if mountpoint -q "$D/mnt" 2>/dev/null; then
    umount "$D/mnt" 2>/dev/null || umount -l "$D/mnt" 2>/dev/null || true
  fi
  local pid
  for f in "$D/pids" "$D/fusepid" "$D/rgwpid"; do
    [[ -f "$f" ]] || continue
    while read -r pid; do
      [[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null
    done < "$f"
  done
  # Nothing of ours may outlive this (a daemon that forked, a stuck fuse).
  pkill -9 -f -- "-c $D/ceph.conf" 2>/dev/null || true
  for _ in $(seq 20); do pgrep -f -- "-c $D/ceph.conf" >/dev/null || break; sleep 0.25; done
  rm -rf "$D"
}

rgw_start() {
  setsid radosgw -c "$D/ceph.conf" -n client.rgw.gw -f >> "$D/log/rgw.out" 2>&1 < /dev/null &
  echo $! > "$D/rgwpid"
  # radosgw needs several seconds before it answers.
  wait_for 120 curl -sf -o /dev/null "http://127.0.0.1:$((BASE + 2))/" ||
    die "radosgw did not answer on 127.0.0.1:$((BASE + 2)) within 60 s"
}

up() {
  local missing=()
  for b in ceph-mon ceph-osd radosgw radosgw-admin ceph-mds ceph-fuse ceph-authtool monmaptool ceph; do
    command -v "$b" >/dev/null || missing+=("$b")
  done
  rm -f "$D.skipped"
  if ((${#missing[@]})); then
    skip "Ceph is not installed (missing ${missing[*]}; apt-get install ceph-mon ceph-osd radosgw ceph-common ceph-mds ceph-fuse)"
  fi
  [[ -e /dev/fuse ]] || skip "no /dev/fuse here, so CephFS cannot be mounted"
  down
  mkdir -p "$D"/{run,log,mon.a,osd.0,mds.a,rgw,mnt,crash}
  local t0=$SECONDS fsid
  fsid=$(uuidgen)
  cat > "$D/ceph.conf" <<CONF
[global]
fsid = $fsid
mon_host = [v2:127.0.0.1:$BASE,v1:127.0.0.1:$((BASE + 1))]
public_addr = 127.0.0.1
ms_bind_port_min = $((BASE + 10))
ms_bind_port_max = $((BASE + 79))
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
keyring = $D/keyring
run_dir = $D/run
pid_file = $D/run/\$name.pid
log_file = $D/log/\$name.log
crash_dir = $D/crash
mon_data = $D/mon.\$id
osd_data = $D/osd.\$id
mds_data = $D/mds.\$id
auth_allow_insecure_global_id_reclaim = false
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_max_pg_per_osd = 1000
mon_data_avail_crit = 1
mon_data_avail_warn = 2
osd_crush_chooseleaf_type = 0
osd_objectstore = bluestore
bluestore_block_create = true
bluestore_block_size = 8589934592
bluestore_block_db_create = false
bluestore_block_wal_create = false
osd_memory_target = 939524096
mgr_initial_modules =
[mon]
admin_socket = $D/run/\$name.asok
[osd]
admin_socket = $D/run/\$name.asok
[mds]
admin_socket = $D/run/\$name.asok
[client]
admin_socket = $D/run/\$name.\$pid.asok
[client.rgw.gw]
rgw_frontends = beast endpoint=127.0.0.1:$((BASE + 2))
rgw_data = $D/rgw
rgw_dns_name = s3.strata.test
CONF
  local C="-c $D/ceph.conf"
  local kr="$D/keyring"
  ceph-authtool --create-keyring "$kr" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool "$kr" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' \
    --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$kr" --gen-key -n osd.0 --cap mon 'allow profile osd' --cap mgr 'allow profile osd' \
    --cap osd 'allow *' >/dev/null
  ceph-authtool "$kr" --gen-key -n client.rgw.gw --cap mon 'allow rw' --cap osd 'allow rwx' \
    --cap mgr 'allow rw' >/dev/null
  ceph-authtool "$kr" --gen-key -n mds.a --cap mon 'allow profile mds' --cap osd 'allow *' \
    --cap mds 'allow' --cap mgr 'allow profile mds' >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$BASE,v1:127.0.0.1:$((BASE + 1))]" \
    "$D/monmap" >/dev/null || die "monmaptool failed"
  ceph-mon $C --mkfs -i a --monmap "$D/monmap" --keyring "$kr" > "$D/log/mon-mkfs.out" 2>&1 ||
    die "ceph-mon --mkfs failed"
  ceph-mon $C -i a -f > "$D/log/mon.out" 2>&1 &
  echo $! > "$D/pids"
  timeout 60 ceph $C --connect-timeout 30 mon stat >/dev/null 2>&1 || die "the mon did not come up"
  say "mon up ($((SECONDS - t0)) s)"
  local uuid
  uuid=$(uuidgen)
  ceph $C osd new "$uuid" 0 >/dev/null || die "ceph osd new failed"
  ceph-osd $C -i 0 --mkfs --osd-uuid "$uuid" > "$D/log/osd-mkfs.out" 2>&1 || die "ceph-osd --mkfs failed"
  ceph-osd $C -i 0 -f > "$D/log/osd.out" 2>&1 &
  echo $! >> "$D/pids"
  wait_for 120 bash -c "ceph $C osd stat 2>/dev/null | grep -q '1 up'" || die "the OSD did not come up"
  say "osd up ($((SECONDS - t0)) s)"
  rgw_start
  say "radosgw up on 127.0.0.1:$((BASE + 2)) ($((SECONDS - t0)) s)"
  local key secret
  key="STRATA$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F)"
  secret=$(head -c 30 /dev/urandom | base64 | tr -d '/+=\n')
  radosgw-admin $C user create --uid=strata --display-name=strata --access-key="$key" \
    --secret-key="$secret" >/dev/null 2>&1 || die "radosgw-admin user create failed"
  (umask 077
   printf '[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n' "$key" "$secret" > "$D/s3.credentials"
   printf '[default]\naccess_key = %s\nsecret_key = %s\nhost_base = 127.0.0.1:%d\nhost_bucket = 127.0.0.1:%d\nuse_https = False\nsignature_v2 = False\n' \
     "$key" "$secret" $((BASE + 2)) $((BASE + 2)) > "$D/s3cmd.cfg")
  ceph $C osd pool create cephfs_metadata 8 >/dev/null 2>&1 || die "pool create failed"
  ceph $C osd pool create cephfs_data 8 >/dev/null 2>&1 || die "pool create failed"
  ceph $C fs new cephfs cephfs_metadata cephfs_data >/dev/null 2>&1 || die "ceph fs new failed"
  ceph-mds $C -i a -f > "$D/log/mds.out" 2>&1 &
  echo $! >> "$D/pids"
  wait_for 120 bash -c "ceph $C mds stat 2>/dev/null | grep -q 'up:active'" || die "the MDS did not become active"
  say "mds active ($((SECONDS - t0)) s)"
  ceph-fuse $C -n client.admin -f "$D/mnt" > "$D/log/fuse.out" 2>&1 &
  echo $! > "$D/fusepid"
  wait_for 60 mountpoint -q "$D/mnt" || die "ceph-fuse did not mount $D/mnt"
  say "cephfs mounted at $D/mnt ($((SECONDS - t0)) s)"
  cat > "$D/env" <<ENV
CEPH_DIR=$D
CEPH_CONF=$D/ceph.conf
CEPH_PORT_BASE=$BASE
S3_ENDPOINT=http://127.0.0.1:$((BASE + 2))
S3_CREDENTIALS=$D/s3.credentials
S3CMD_CONFIG=$D/s3cmd.cfg
CEPHFS=$D/mnt
ENV
  say "up in $((SECONDS - t0)) s"
}

case "$cmd" in
  up)
    # One more try from nothing if the first one fails: a slow disk or a
    # busy machine must not fail the suite, and the first failure is shown.
    if ! (up); then
      say "bring-up failed once; trying again from nothing"
      (up) || { down; exit 1; }
    fi
    ;;
  down) down ;;
  rgw-stop)
    [[ -f "$D/rgwpid" ]] && kill -9 "$(cat "$D/rgwpid")" 2>/dev/null
    wait_for 20 bash -c "! curl -s -o /dev/null http://127.0.0.1:$((BASE + 2))/" || true
    ;;
  rgw-start)
    BASE=$(sed -n 's/^CEPH_PORT_BASE=//p' "$D/env")
    rgw_start
    ;;
  *) echo "usage: ceph.sh up|down|rgw-stop|rgw-start DIR [PORT_BASE]" >&2; exit 2 ;;
esac

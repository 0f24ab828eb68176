# Sourced by the tests that need the Ceph of tests/storage/ceph/ceph.sh
# (the ctest fixture "ceph"): loads its env file ($CEPH_ENV) or skips,
# saying why. Expects BUILD_DIR; sources tests/e2e/lib.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/lib.sh"
CEPH_SH="$ROOT/tests/storage/ceph/ceph.sh"
if [[ -z "${CEPH_ENV:-}" || ! -f "$CEPH_ENV" ]]; then
  why="$(cat "$(dirname "${CEPH_ENV:-/nonexistent/env}").skipped" 2>/dev/null || true)"
  skip "no Ceph: ${why:-\$CEPH_ENV names no env file of tests/storage/ceph/ceph.sh (run it through ctest)}"
fi
# shellcheck disable=SC1090
source "$CEPH_ENV"
command -v s3cmd >/dev/null || skip "s3cmd is not installed (apt-get install s3cmd)"
s3() { s3cmd -c "$S3CMD_CONFIG" --no-progress "$@"; }

# s3_yaml: the config's s3 section for this Ceph's radosgw.
s3_yaml() {
  cat <<YAML
s3:
  endpoint: $S3_ENDPOINT
  credentials_file: ${1:-$S3_CREDENTIALS}
  part_size_mb: 5
  parallel_parts: 4
  timeout_seconds: 10
  retries: 3
YAML
}

# The seq of the newest complete checkpoint under ROOT (s3:// or local).
latest_seq() {  # latest_seq ROOT CONFIG
  "$STRATA" checkpoint list --dir "$1" --config "$2" |
    awk '$2 == "full" || $2 == "incremental" { s = $1 } END { print s }'
}
# The state digest of checkpoint SEQ under ROOT.
digest_of() {  # digest_of ROOT SEQ CONFIG
  "$STRATA" checkpoint verify --dir "$1/$(printf 'ckpt-%08d' "$2")" --config "$3" --json |
    sed -n 's/.*"state_digest": "\([0-9a-f]*\)".*/\1/p'
}
# Fashion-MNIST copied into CephFS once; prints the directory.
fmnist_on_cephfs() {
  local d="$CEPHFS/datasets/fashion-mnist"
  if [[ ! -f "$d/.complete" ]]; then
    mkdir -p "$d"
    cp "$FMNIST"/*-ubyte.gz "$d/"
    sync
    touch "$d/.complete"
  fi
  echo "$d"
}

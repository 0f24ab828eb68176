#!/usr/bin/env bash
# Makes the certificates of a Strata cluster with OpenSSL (docs/security.md).
#
#   gen-certs.sh cluster --hosts HOSTFILE --out DIR [--days N]
#       DIR/ca/ca.crt, ca.key    the cluster CA (made once, reused after;
#                                ca.key never leaves this machine)
#       DIR/HOST/                one directory a host of the host file, to
#                                install as that host's /etc/strata/tls:
#                                ca.crt and ROLE.crt, ROLE.key for each role
#                                the host runs (master, pserver, worker);
#                                subject O=strata, OU=ROLE, CN=ROLE@HOST, the
#                                host as subjectAltName; and one a pserver
#                                and worker instance, ROLE-INDEX.crt with
#                                CN=ROLE-INDEX@HOST (indexes as the launch
#                                plan numbers them: in host file order),
#                                which the daemon of that index uses
#       DIR/admin/               ca.crt, client.crt, client.key of a person
#                                "admin" with role admin: the CLI's --tls-dir
#   gen-certs.sh user --out DIR --name NAME --role admin|operator|viewer [--days N]
#       DIR/users/NAME/          ca.crt, client.crt, client.key (CN=NAME, OU=ROLE)
#   gen-certs.sh node --out DIR --host HOST --role master|pserver|worker [--index I] [--days N]
#       DIR/HOST/ROLE.crt, .key  one more daemon certificate (ROLE-I.crt,
#                                CN=ROLE-I@HOST with --index: for that
#                                instance only)
#   gen-certs.sh revoke --out DIR --cert FILE
#       adds FILE's certificate to the CA's revocation list DIR/ca/crl.pem
#       and copies the list into every directory of DIR that holds a
#       ca.crt: install it beside each host's ca.crt (launch.sh --systemd
#       does); servers refuse a revoked client certificate within
#       security.refresh_seconds
#   gen-certs.sh token --out DIR --name NAME --role admin|operator|viewer
#       appends "NAME ROLE TOKEN" to DIR/tokens (mode 0600: the servers'
#       security.token_file) and writes the token alone to
#       DIR/users/NAME/token (the CLI's --token-file)
#
# Keys are ECDSA P-256, mode 0600. --days: validity of the new certificates
# (default 825; 0 makes one that has already expired, for tests).
set -euo pipefail

die() { echo "gen-certs.sh: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed -n '/^#/p' | sed 's/^# \{0,1\}//'; }

[[ $# -ge 1 ]] || { usage >&2; exit 2; }
cmd="$1"; shift
OUT="" HOSTS="" DAYS=825 NAME="" ROLE="" HOST="" CERT="" INDEX=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --hosts) HOSTS="$2"; shift 2 ;;
    --days) DAYS="$2"; shift 2 ;;
    --name) NAME="$2"; shift 2 ;;
    --role) ROLE="$2"; shift 2 ;;
    --host) HOST="$2"; shift 2 ;;
    --cert) CERT="$2"; shift 2 ;;
    --index) INDEX="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1'" ;;
  esac
done
[[ -n "$OUT" ]] || die "--out DIR is required"
[[ "$DAYS" =~ ^[0-9]+$ ]] || die "--days must be a whole number, got '$DAYS'"
command -v openssl > /dev/null || die "openssl not found (apt-get install openssl)"
umask 077

# The CA: made once.
ensure_ca() {
  mkdir -p "$OUT/ca"
  if [[ -f "$OUT/ca/ca.crt" && -f "$OUT/ca/ca.key" ]]; then return; fi
  # A CA whose key was taken away (kept offline): never replaced by a new one.
  [[ -f "$OUT/ca/ca.crt" ]] &&
    die "$OUT/ca/ca.key is missing: put the CA's key back to sign with it (a new CA would orphan every certificate of this one)"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$OUT/ca/ca.key" -out "$OUT/ca/ca.crt" -days 3650 \
    -subj "/O=strata/CN=strata cluster CA $(date -u +%Y%m%d%H%M%S)" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2> "$OUT/ca/openssl.log" ||
    { cat "$OUT/ca/openssl.log" >&2; die "cannot make the CA"; }
  chmod 600 "$OUT/ca/ca.key"
  chmod 644 "$OUT/ca/ca.crt"
  echo "CA: $OUT/ca/ca.crt"
}

# sign DIR BASENAME OU CN SAN [USAGE]: DIR/BASENAME.key and DIR/BASENAME.crt
# (USAGE: extendedKeyUsage, serverAuth,clientAuth by default).
sign() {
  local dir="$1" base="$2" ou="$3" cn="$4" san="$5" usage="${6:-serverAuth,clientAuth}"
  mkdir -p "$dir"
  cp "$OUT/ca/ca.crt" "$dir/ca.crt"
  chmod 644 "$dir/ca.crt"
  local ext; ext="$(mktemp)"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [[ -n "$san" ]] && echo "subjectAltName=$san"
  } > "$ext"
  if ! openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -keyout "$dir/$base.key" -out "$dir/$base.csr" -subj "/O=strata/OU=$ou/CN=$cn" \
      2> "$dir/openssl.log" ||
     ! openssl x509 -req -in "$dir/$base.csr" -CA "$OUT/ca/ca.crt" -CAkey "$OUT/ca/ca.key" \
      -set_serial "0x$(openssl rand -hex 16)" -days "$DAYS" -extfile "$ext" \
      -out "$dir/$base.crt" 2>> "$dir/openssl.log"; then
    cat "$dir/openssl.log" >&2
    rm -f "$ext"
    die "cannot make $dir/$base.crt"
  fi
  rm -f "$ext" "$dir/$base.csr" "$dir/openssl.log"
  chmod 600 "$dir/$base.key"
  chmod 644 "$dir/$base.crt"
}

# The subjectAltName of a host: its address or name (and loopback's names).
san_of() {
  local h="$1"
  if [[ "$h" =~ ^[0-9.]+$ ]]; then
    echo -n "IP:$h"
  elif [[ "$h" == *:* ]]; then
    echo -n "IP:$h"
  else
    echo -n "DNS:$h"
  fi
  case "$h" in
    127.0.0.1) echo -n ",DNS:localhost" ;;
    127.*|localhost|::1) echo -n ",DNS:localhost,IP:127.0.0.1" ;;
  esac
}

check_person_role() {
  case "$1" in admin|operator|viewer) ;; *) die "--role must be admin, operator or viewer, got '$1'" ;; esac
}

case "$cmd" in
  cluster)
    [[ -n "$HOSTS" ]] || die "cluster: --hosts HOSTFILE is required"
    [[ -r "$HOSTS" ]] || die "cluster: cannot read $HOSTS"
    ensure_ca
    n=0
    declare -A next_index=()
    spare=()  # "HOST ROLE COUNT": room to scale, numbered after the started ones
    # Host file lines: HOST ROLE[=COUNT|=N..M]...; '#' comments (common/host_file.h).
    while IFS= read -r line || [[ -n "$line" ]]; do
      line="${line%%#*}"
      read -r -a f <<< "$line" || true
      [[ ${#f[@]} -ge 2 ]] || continue
      host="${f[0]}"
      for item in "${f[@]:1}"; do
        role="${item%%=*}"
        count=1 most=1
        [[ "$item" == *=* ]] && count="${item#*=}"
        case "$role" in master|pserver|worker) ;; *) die "$HOSTS: unknown role '$role' on host $host" ;; esac
        if [[ "$count" =~ ^([0-9]+)\.\.([0-9]+)$ ]]; then
          count="${BASH_REMATCH[1]}" most="${BASH_REMATCH[2]}"
          (( most >= 1 && most >= count )) || die "$HOSTS: bad range in '$item' on host $host"
        else
          [[ "$count" =~ ^[1-9][0-9]*$ ]] || die "$HOSTS: bad count in '$item' on host $host"
          most="$count"
        fi
        sign "$OUT/$host" "$role" "$role" "$role@$host" "$(san_of "$host")"
        n=$((n + 1))
        # One per instance, numbered as the launch plan does (per role, in
        # host file order: the started ones, then the room to scale).
        if [[ "$role" != master ]]; then
          for ((k = 0; k < count; k++)); do
            i="${next_index[$role]:-0}"
            sign "$OUT/$host" "$role-$i" "$role" "$role-$i@$host" "$(san_of "$host")"
            next_index[$role]=$((i + 1))
          done
          if (( most > count )); then spare+=("$host $role $((most - count))"); fi
        fi
      done
    done < "$HOSTS"
    for entry in ${spare[@]+"${spare[@]}"}; do
      read -r host role count <<< "$entry"
      for ((k = 0; k < count; k++)); do
        i="${next_index[$role]:-0}"
        sign "$OUT/$host" "$role-$i" "$role" "$role-$i@$host" "$(san_of "$host")"
        next_index[$role]=$((i + 1))
      done
    done
    [[ $n -gt 0 ]] || die "$HOSTS: no daemons"
    sign "$OUT/admin" client admin admin "" clientAuth
    echo "certificates of $n daemon role(s) in $OUT/<host>/; the CLI's in $OUT/admin (role admin)"
    ;;
  user)
    [[ -n "$NAME" && -n "$ROLE" ]] || die "user: --name NAME and --role ROLE are required"
    check_person_role "$ROLE"
    [[ "$NAME" =~ ^[A-Za-z0-9._@-]+$ ]] || die "user: --name may hold letters, digits and ._@- only"
    ensure_ca
    sign "$OUT/users/$NAME" client "$ROLE" "$NAME" "" clientAuth
    echo "$OUT/users/$NAME: $NAME ($ROLE)"
    ;;
  node)
    [[ -n "$HOST" && -n "$ROLE" ]] || die "node: --host HOST and --role ROLE are required"
    case "$ROLE" in master|pserver|worker) ;; *) die "node: --role must be master, pserver or worker" ;; esac
    ensure_ca
    base="$ROLE"
    if [[ -n "$INDEX" ]]; then
      [[ "$INDEX" =~ ^[0-9]+$ && "$ROLE" != master ]] ||
        die "node: --index must be a whole number, for a pserver or worker"
      base="$ROLE-$INDEX"
    fi
    sign "$OUT/$HOST" "$base" "$ROLE" "$base@$HOST" "$(san_of "$HOST")"
    echo "$OUT/$HOST/$base.crt"
    ;;
  revoke)
    [[ -n "$CERT" && -r "$CERT" ]] || die "revoke: --cert FILE is required (a certificate to revoke)"
    [[ -f "$OUT/ca/ca.crt" && -f "$OUT/ca/ca.key" ]] || die "revoke: no CA in $OUT/ca"
    openssl verify -CAfile "$OUT/ca/ca.crt" "$CERT" > /dev/null 2>&1 ||
      die "revoke: $CERT was not issued by the CA of $OUT"
    serial="$(openssl x509 -in "$CERT" -noout -serial | cut -d= -f2)"
    subject="$(openssl x509 -in "$CERT" -noout -subject -nameopt compat | sed 's/^subject=//')"
    end="$(date -u -d "$(openssl x509 -in "$CERT" -noout -enddate | cut -d= -f2)" +%y%m%d%H%M%SZ)"
    touch "$OUT/ca/index.txt"
    [[ -f "$OUT/ca/crlnumber" ]] || echo 01 > "$OUT/ca/crlnumber"
    if ! grep -q "	$serial	" "$OUT/ca/index.txt"; then
      printf 'R\t%s\t%s\t%s\tunknown\t%s\n' "$end" "$(date -u +%y%m%d%H%M%SZ)" "$serial" "$subject" \
        >> "$OUT/ca/index.txt"
    fi
    cfg="$(mktemp)"
    printf '%s\n' "[ ca ]" "default_ca = strata" "[ strata ]" "database = $OUT/ca/index.txt" \
      "certificate = $OUT/ca/ca.crt" "private_key = $OUT/ca/ca.key" "crlnumber = $OUT/ca/crlnumber" \
      "default_md = sha256" "default_crl_days = 3650" > "$cfg"
    openssl ca -gencrl -config "$cfg" -out "$OUT/ca/crl.pem" 2> "$OUT/ca/openssl.log" ||
      { cat "$OUT/ca/openssl.log" >&2; rm -f "$cfg"; die "cannot make the revocation list"; }
    rm -f "$cfg" "$OUT/ca/openssl.log"
    chmod 644 "$OUT/ca/crl.pem"
    n=0
    while IFS= read -r d; do
      [[ "$d" == "$OUT/ca" ]] && continue
      cp "$OUT/ca/crl.pem" "$d/crl.pem.new" && mv "$d/crl.pem.new" "$d/crl.pem"
      n=$((n + 1))
    done < <(find "$OUT" -name ca.crt -printf '%h\n' | sort -u)
    echo "revoked serial $serial ($subject); $OUT/ca/crl.pem copied to $n director(ies)"
    ;;
  token)
    [[ -n "$NAME" && -n "$ROLE" ]] || die "token: --name NAME and --role ROLE are required"
    check_person_role "$ROLE"
    [[ "$NAME" =~ ^[A-Za-z0-9._@-]+$ ]] || die "token: --name may hold letters, digits and ._@- only"
    mkdir -p "$OUT/users/$NAME"
    token="$(openssl rand -hex 32)"
    echo "$NAME $ROLE $token" >> "$OUT/tokens"
    chmod 600 "$OUT/tokens"
    echo "$token" > "$OUT/users/$NAME/token"
    chmod 600 "$OUT/users/$NAME/token"
    echo "token of $NAME ($ROLE): $OUT/users/$NAME/token; the servers' table: $OUT/tokens"
    ;;
  *) die "unknown command '$cmd' (cluster, user, node, token, revoke)" ;;
esac

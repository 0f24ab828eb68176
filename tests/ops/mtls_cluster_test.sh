#!/usr/bin/env bash
# The control plane's security on real daemons (docs/security.md): the
# certificates of scripts/gen-certs.sh; daemons that refuse a key others may
# read or missing certificates; a cluster under launch.sh with mTLS where
# the CLI gets in with an admin certificate, a viewer certificate or an
# operator's token as far as the policy lets each, and not at all without
# credentials, with a wrong token or in plain text; every refusal in the
# audit log with the caller's identity; plain text said on the status.
BUILD_DIR="$1"
source "$(dirname "$0")/../faults/lib.sh"
command -v openssl > /dev/null || skip "openssl not installed"
BIN="$BUILD_DIR/bin"
# No ~/.strata/tls or STRATA_* credentials of the caller's.
export HOME="$WORK/home"
mkdir -p "$HOME"
unset STRATA_TLS_DIR STRATA_TOKEN_FILE

TEST_SECURITY=mtls fault_config 0 40
TLS="$WORK/tls"
GEN="$ROOT/scripts/gen-certs.sh"
"$GEN" cluster --hosts "$WORK/hosts" --out "$TLS" > /dev/null
"$GEN" user --out "$TLS" --name bob --role viewer > /dev/null
"$GEN" token --out "$TLS" --name carol --role operator > /dev/null
printf '  token_file: %s\n  refresh_seconds: 1\n' "$TLS/tokens" >> "$WORK/job.yaml"
grep -q '^  mode: mtls$' "$WORK/job.yaml" || fail "the job's config is not mtls"
for f in "$TLS"/127.0.0.1/*.key "$TLS"/admin/client.key "$TLS"/ca/ca.key "$TLS/tokens"; do
  [[ "$(stat -c %a "$f")" == 600 ]] || fail "$f has mode $(stat -c %a "$f"), not 600"
done
grep -q 'OU = worker, CN = worker@127.0.0.1' <(openssl x509 -in "$TLS/127.0.0.1/worker.crt" -noout -subject) ||
  fail "the worker's certificate does not name its role and host"

# A daemon does not start on a key its group may read, nor without certificates.
cp -r "$TLS/127.0.0.1" "$WORK/loose"
chmod 640 "$WORK/loose/master.key"
set +e
"$BIN/strata-master" --config "$WORK/job.yaml" --hosts "$WORK/hosts" --tls_dir "$WORK/loose" \
  --port 0 --http_port -1 > "$WORK/loose.out" 2>&1; rc=$?
set -e
[[ $rc -ne 0 ]] && grep -q "loose/master.key: mode 0640 lets group or others read this secret" "$WORK/loose.out" ||
  { cat "$WORK/loose.out"; fail "the master started on a key readable by its group (rc $rc)"; }
set +e
"$BIN/strata-worker" --config "$WORK/job.yaml" --master 127.0.0.1:1 --tls_dir "$WORK/none" \
  --http_port -1 > "$WORK/none.out" 2>&1; rc=$?
set -e
[[ $rc -ne 0 ]] && grep -q "none/ca.crt: cannot open" "$WORK/none.out" ||
  { cat "$WORK/none.out"; fail "the worker started without certificates (rc $rc)"; }

start_job sec --tls-dir "$TLS"
wait_for_samples sec 3000
master="127.0.0.1:$BASE"
S="$BIN/strata"

# expect_refused NAME PATTERN strata-args...: exit 1 and PATTERN in stderr.
expect_refused() {
  local name="$1" pattern="$2"; shift 2
  set +e
  "$S" "$@" > "$WORK/out" 2> "$WORK/err"; local rc=$?
  set -e
  [[ $rc -ne 0 ]] && grep -q -- "$pattern" "$WORK/err" ||
    { cat "$WORK/out" "$WORK/err"; fail "$name: not refused with '$pattern' (rc $rc)"; }
}

# No credentials: plain text, refused at the handshake, with a hint.
expect_refused "no credentials" "needs --tls-dir DIR or STRATA_TLS_DIR" status --master "$master"
expect_refused "plain text" "failed to connect" status --master "$master" --plaintext
# The admin: everything.
STRATA_TLS_DIR="$TLS/admin" "$S" status --master "$master" > "$WORK/admin.out" ||
  fail "the admin's status failed"
grep -q '^  security: mtls$' "$WORK/admin.out" || { cat "$WORK/admin.out"; fail "status does not say mtls"; }
# A viewer: reads, does not act.
"$S" status --master "$master" --tls-dir "$TLS/users/bob" > /dev/null || fail "the viewer's status failed"
expect_refused "viewer stop" "role viewer may not call /strata.proto.Master/Stop" \
  stop --master "$master" --tls-dir "$TLS/users/bob"
expect_refused "viewer drain" "role viewer may not call /strata.proto.Master/Drain" \
  drain worker-1 --master "$master" --tls-dir "$TLS/users/bob" --no-wait
# A revoked certificate: refused once the servers read the new list.
"$GEN" user --out "$TLS" --name eve --role viewer > /dev/null
"$S" status --master "$master" --tls-dir "$TLS/users/eve" > /dev/null || fail "eve's status failed"
"$GEN" revoke --out "$TLS" --cert "$TLS/users/eve/client.crt" > /dev/null
for _ in $(seq 1 40); do
  "$S" status --master "$master" --tls-dir "$TLS/users/eve" > /dev/null 2>&1 || break
  sleep 0.1
done
expect_refused "revoked certificate" "client certificate 'eve' refused: certificate revoked" \
  status --master "$master" --tls-dir "$TLS/users/eve"
"$S" status --master "$master" --tls-dir "$TLS/users/bob" > /dev/null || fail "bob was refused with eve"
# An operator by token (TLS with the CA only): reads, may not stop.
mkdir -p "$WORK/token-client"
cp "$TLS/ca/ca.crt" "$WORK/token-client/"
"$S" status --master "$master" --tls-dir "$WORK/token-client" --token-file "$TLS/users/carol/token" \
  > /dev/null || fail "the operator's token was refused"
expect_refused "operator stop" "role operator may not call /strata.proto.Master/Stop" \
  stop --master "$master" --tls-dir "$WORK/token-client" --token-file "$TLS/users/carol/token"
openssl rand -hex 32 > "$WORK/bad-token"
chmod 600 "$WORK/bad-token"
expect_refused "wrong token" "unknown bearer token" \
  status --master "$master" --tls-dir "$WORK/token-client" --token-file "$WORK/bad-token"
chmod 644 "$WORK/bad-token"
expect_refused "readable token file" "bad-token: mode 0644" \
  status --master "$master" --tls-dir "$WORK/token-client" --token-file "$WORK/bad-token"
expect_refused "token in plain text" "a token is sent only over TLS" \
  status --master "$master" --token-file "$TLS/users/carol/token"
# Each node registered with the identity of its certificate.
STRATA_TLS_DIR="$TLS/admin" "$S" status --master "$master" --json > "$WORK/status.json"
python3 - "$WORK/status.json" <<'PY' || { cat "$WORK/status.json"; fail "the nodes' identities are wrong"; }
import json, sys
st = json.load(open(sys.argv[1]))
assert st["job"]["security"] == "mtls", st["job"].get("security")
ids = {(m["role"], m.get("identity", "")) for m in st["view"]["members"] if m["role"] != "MASTER"}
# (Each daemon with its instance's own certificate: gen-certs.sh cluster.)
want = {("PSERVER", f"pserver:pserver-{i}@127.0.0.1") for i in range(3)}
want |= {("WORKER", f"worker:worker-{i}@127.0.0.1") for i in range(2)}
assert ids == want, ids
PY
# The HTTP endpoints: HTTPS only, to people's roles (docs/security.md).
code_of() {  # code_of URL [curl args]: the HTTP status curl gets
  local url="$1"; shift
  curl -s -o "$WORK/body" -w '%{http_code}' --cacert "$TLS/ca/ca.crt" "$@" "$url" || true
}
murl="https://127.0.0.1:$((BASE + 1))"
purl="https://127.0.0.1:$((BASE + 30))"
[[ "$(code_of "$murl/status" --cert "$TLS/admin/client.crt" --key "$TLS/admin/client.key")" == 200 ]] &&
  python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["job"]["security"] == "mtls"' "$WORK/body" ||
  fail "the admin cannot read the master's /status over https"
[[ "$(code_of "$murl/logs" --cert "$TLS/users/bob/client.crt" --key "$TLS/users/bob/client.key")" == 403 ]] ||
  fail "the viewer read the master's /logs"
[[ "$(code_of "$murl/metrics" --cert "$TLS/users/bob/client.crt" --key "$TLS/users/bob/client.key")" == 200 ]] ||
  fail "the viewer cannot read the master's /metrics"
[[ "$(code_of "$murl/status")" == 401 ]] || fail "the master's /status answered without credentials"
[[ "$(code_of "$murl/healthz")" == 200 ]] || fail "/healthz is not open"
[[ "$(code_of "$purl/metrics" --cert "$TLS/127.0.0.1/worker.crt" --key "$TLS/127.0.0.1/worker.key")" == 403 ]] ||
  fail "a worker's certificate read a pserver's /metrics"
[[ "$(code_of "$purl/logs" -H "Authorization: Bearer $(cat "$TLS/users/carol/token")")" == 200 ]] ||
  fail "the operator's token cannot read a pserver's /logs"
[[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((BASE + 1))/status" || true)" == 400 ]] ||
  fail "plain http to the master's HTTPS port was not answered 400"
# The CLI reads the daemons' endpoints over https with its certificate.
"$S" logs master --master "$master" --lines 5 --tls-dir "$TLS/admin" > "$WORK/logs.out" ||
  fail "strata logs over https failed"
[[ -s "$WORK/logs.out" ]] || fail "strata logs printed nothing"
"$S" top --master "$master" --iterations 1 --interval 0.5 --json --tls-dir "$TLS/admin" > "$WORK/top.json" ||
  fail "strata top over https failed"
python3 - "$WORK/top.json" <<'PY' || { cat "$WORK/top.json"; fail "strata top does not read the daemons' metrics over https"; }
import json, sys
f = json.loads(open(sys.argv[1]).readline())
up = {n['name'] for n in f['nodes'] if n['up']}
assert {'master-0', 'pserver-0', 'worker-0'} <= up, up
PY

# The data plane: a connection that skips the membership handshake is
# closed unanswered; the pserver serves on.
python3 - "$((BASE + 20))" <<'PY' || fail "a pserver answered a request without the handshake"
import socket, struct, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
# A ping frame (docs/wire-protocol.md): magic, version 1, type 5, 64 zero
# bytes of header fields, payload_bytes 4, then the payload.
frame = b"STR1" + struct.pack("<HH", 1, 5) + bytes(56) + struct.pack("<Q", 4) + b"ping"
assert len(frame) == 72 + 4
s.sendall(frame)
got = s.recv(4096)
sys.exit(0 if got == b"" else 1)  # closed, nothing said
PY
grep -q "PING from 127.0.0.1:[0-9]* (4 bytes) before the data-plane handshake: connection closed unserved" \
  "$WORK/run-sec/logs/pserver-0.log" || fail "pserver 0 does not log the dropped connection"
before="$(job_samples)"
sleep 1
(( $(job_samples) > before )) || fail "training stopped after the unauthenticated connection"

# The admin stops the job.
STRATA_TLS_DIR="$TLS/admin" "$S" stop --master "$master" --no-checkpoint > /dev/null ||
  fail "the admin could not stop the job"
wait_job || true
[[ "$(json_field "$WORK/run-sec/summary.json" state)" == stopped ]] ||
  fail "the job is $(json_field "$WORK/run-sec/summary.json" state), not stopped"

# The audit log: every refusal with who and from where; the chain intact.
audit="$WORK/run-sec/audit.jsonl"
"$S" audit verify --file "$audit" > /dev/null || fail "the audit log does not verify"
for pattern in \
    '"who": "viewer:bob", "from": "ipv4:127.0.0.1:[0-9]*", "action": "stop", "target": "", "result": "refused: PERMISSION_DENIED' \
    '"who": "viewer:bob", "from": "ipv4:127.0.0.1:[0-9]*", "action": "drain", "target": "", "result": "refused: PERMISSION_DENIED' \
    '"who": "operator:carol", "from": "ipv4:127.0.0.1:[0-9]*", "action": "stop", "target": "", "result": "refused: PERMISSION_DENIED' \
    '"who": "unauthenticated", "from": "ipv4:127.0.0.1:[0-9]*", "action": "get_status", "target": "", "result": "refused: UNAUTHENTICATED: unknown bearer token' \
    '"who": "admin:admin", "from": "ipv4:127.0.0.1:[0-9]*", "action": "stop", "target": "job", "result": "ok"' \
    '"who": "viewer:bob", "from": "127.0.0.1:[0-9]*", "action": "http GET /logs", "target": "", "result": "refused: PERMISSION_DENIED: role viewer may not GET /logs' \
    '"who": "unauthenticated", "from": "127.0.0.1:[0-9]*", "action": "http GET /status", "target": "", "result": "refused: UNAUTHENTICATED: no credentials' \
    '"who": "unauthenticated", "from": "ipv4:127.0.0.1:[0-9]*", "action": "get_status", "target": "", "result": "refused: UNAUTHENTICATED: client certificate .eve. refused: certificate revoked'; do
  grep -q "$pattern" "$audit" || { cat "$audit"; fail "the audit log lacks: $pattern"; }
done
# Secrets never in the logs: no token, no key.
token="$(cat "$TLS/users/carol/token")"
if grep -rqF -- "$token" "$WORK/run-sec/logs" "$audit"; then fail "a token is in the logs"; fi
if grep -rq -- "PRIVATE KEY" "$WORK/run-sec/logs" "$audit"; then fail "a key is in the logs"; fi

# Plain text only when the config says so, and then said everywhere.
sed -e 's/^  mode: mtls$/  mode: plaintext/' -e '/^  token_file:/d' "$WORK/job.yaml" > "$WORK/plain.yaml"
"$BIN/strata-master" --config "$WORK/plain.yaml" --hosts "$WORK/hosts" > "$WORK/plain.out" 2>&1 &
plain_pid=$!
for _ in $(seq 1 100); do
  "$S" status --master "$master" > "$WORK/plain.status" 2>/dev/null && break
  sleep 0.1
done
grep -q 'security: PLAINTEXT - no TLS, no authentication' "$WORK/plain.status" ||
  { cat "$WORK/plain.status" "$WORK/plain.out"; fail "strata status does not say plain text"; }
# (Its HTTP port opens just after its gRPC one; no pipe into grep -q, whose
# early exit would fail curl under pipefail.)
for _ in $(seq 1 50); do
  curl -sf "http://127.0.0.1:$((BASE + 1))/" > "$WORK/plain.html" 2>/dev/null && break
  sleep 0.1
done
grep -q 'Security: <strong>plain text</strong>' "$WORK/plain.html" ||
  fail "the status page does not say plain text"
grep -q 'security.mode is plaintext: the control plane has no TLS and no authentication' "$WORK/plain.out" ||
  fail "the master does not log plain text as a warning"
kill "$plain_pid"
wait "$plain_pid" || true
assert_nothing_left "$WORK"
echo "mtls_cluster_test: OK"

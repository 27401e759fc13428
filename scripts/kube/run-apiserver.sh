#!/usr/bin/env bash
# Starts the kube-apiserver that scripts/kube/build.sh built, on 127.0.0.1 only,
# against an etcd that is already running (the project starts its own on loopback).
#
# Usage: scripts/kube/run-apiserver.sh [options] ETCD_URL STATE_DIR
#   --bin PATH       kube-apiserver binary (default: $TOOLS/bin/kube-apiserver,
#                    TOOLS=${INCUMBENT_TOOLS_DIR:-$HOME/.cache/incumbent-tools})
#   --port N         secure port (default: a free port on 127.0.0.1, picked at random)
#   --prefix P       --etcd-prefix (default: /incumbent-kube-<random>, unique per run)
#   --rbac           --authorization-mode=RBAC (the token is in system:masters, so
#                    it may do anything); default AlwaysAllow, which starts faster
#   --detach         start it in the background, logging to STATE_DIR/apiserver.log,
#                    wait (at most 90 s) for /readyz and for namespace "default",
#                    print "ready <seconds> pid <pid> port <port>" and exit 0
#   --print          print the command line (one flag a line) and exit
#   Without --detach/--print it execs kube-apiserver in the foreground (logs on stderr).
#   Anything after "--" is passed to kube-apiserver after the flags below
#   (a later flag wins), e.g. -- --v=2 --feature-gates=...
#
# STATE_DIR (created) receives: ca.crt ca.key server.crt server.key (a CA and a
# serving cert for 127.0.0.1/localhost, made with openssl), sa.key sa.pub
# (service-account signing key), tokens.csv, token (the admin bearer token),
# kubeconfig (server https://127.0.0.1:PORT, the CA, the token), port, prefix,
# and with --detach: pid, apiserver.log.
set -euo pipefail

TOOLS="${INCUMBENT_TOOLS_DIR:-$HOME/.cache/incumbent-tools}"
BIN="$TOOLS/bin/kube-apiserver"
PORT=""
PREFIX=""
AUTHZ=AlwaysAllow
MODE=exec
ARGS=()
EXTRA=()
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) BIN="$2"; shift 2 ;;
        --port) PORT="$2"; shift 2 ;;
        --prefix) PREFIX="$2"; shift 2 ;;
        --rbac) AUTHZ=RBAC; shift ;;
        --detach) MODE=detach; shift ;;
        --print) MODE=print; shift ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) ARGS+=("$1"); shift ;;
    esac
done
[ ${#ARGS[@]} -eq 2 ] || { echo "usage: $0 [--bin B] [--port N] [--prefix P] [--rbac] [--detach|--print] ETCD_URL STATE_DIR" >&2; exit 2; }
ETCD_URL="${ARGS[0]}"
DIR="${ARGS[1]}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"

if [ -z "$PORT" ]; then
    PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi
if [ -z "$PREFIX" ]; then
    PREFIX="/incumbent-kube-$(date +%s)-$$-$RANDOM"
fi

# Keys and certs: made once per STATE_DIR (about 0.2 s).
if [ ! -s "$DIR/server.crt" ]; then
    (
        cd "$DIR"
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.crt \
            -subj "/CN=incumbent-test-ca" \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr \
            -subj "/CN=kube-apiserver" 2>/dev/null
        printf '%s\n' "basicConstraints=critical,CA:FALSE" \
            "subjectKeyIdentifier=hash" "authorityKeyIdentifier=keyid:always" \
            "keyUsage=critical,digitalSignature,keyEncipherment" \
            "extendedKeyUsage=serverAuth" \
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" > server.ext
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -days 3650 -out server.crt -extfile server.ext 2>/dev/null
        rm -f server.csr server.ext ca.srl
        openssl genrsa -out sa.key 2048 2>/dev/null
        openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    )
fi
if [ ! -s "$DIR/token" ]; then
    TOKEN="incumbent-$(openssl rand -hex 16)"
    echo "$TOKEN" > "$DIR/token"
    # token,user,uid,"group1,group2"
    echo "$TOKEN,incumbent-admin,incumbent-admin,\"system:masters\"" > "$DIR/tokens.csv"
fi
TOKEN="$(cat "$DIR/token")"
echo "$PORT" > "$DIR/port"
echo "$PREFIX" > "$DIR/prefix"

cat > "$DIR/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: incumbent
  cluster:
    server: https://127.0.0.1:$PORT
    certificate-authority: $DIR/ca.crt
users:
- name: incumbent-admin
  user:
    token: $TOKEN
contexts:
- name: incumbent
  context:
    cluster: incumbent
    user: incumbent-admin
    namespace: default
current-context: incumbent
KUBECONFIG

FLAGS=(
    --bind-address=127.0.0.1
    --advertise-address=127.0.0.1
    --secure-port="$PORT"
    --tls-cert-file="$DIR/server.crt"
    --tls-private-key-file="$DIR/server.key"
    --cert-dir="$DIR/certs"
    --etcd-servers="$ETCD_URL"
    --etcd-prefix="$PREFIX"
    --etcd-compaction-interval=0
    --token-auth-file="$DIR/tokens.csv"
    --anonymous-auth=false
    --authorization-mode="$AUTHZ"
    --service-account-issuer=https://kubernetes.default.svc
    --service-account-key-file="$DIR/sa.pub"
    --service-account-signing-key-file="$DIR/sa.key"
    --service-cluster-ip-range=10.0.0.0/24
    --endpoint-reconciler-type=none
    --enable-priority-and-fairness=false
    --enable-admission-plugins=NamespaceLifecycle
    --disable-admission-plugins=__DISABLE__
    --profiling=false
)
# Every plugin on by default in 1.37 (kube-apiserver --help) but NamespaceLifecycle (a Lease in a namespace that
# does not exist is refused, as on a real cluster).
DISABLE="LimitRanger,ServiceAccount,TaintNodesByCondition,PodSecurity,Priority,DefaultTolerationSeconds,DefaultStorageClass,StorageObjectInUseProtection,PodGroupProtection,PersistentVolumeClaimResize,RuntimeClass,CertificateApproval,CertificateSigning,ClusterTrustBundleAttest,CertificateSubjectRestriction,DefaultIngressClass,PodTopologyLabels,NodeDeclaredFeatureValidator,PodResizeValidator,MutatingAdmissionPolicy,MutatingAdmissionWebhook,ValidatingAdmissionPolicy,ValidatingAdmissionWebhook,ResourceQuota"
FLAGS=("${FLAGS[@]/__DISABLE__/$DISABLE}")
FLAGS+=(${EXTRA[@]+"${EXTRA[@]}"})

case "$MODE" in
    print)
        echo "$BIN"; printf '  %s\n' "${FLAGS[@]}"; exit 0 ;;
    exec)
        exec "$BIN" "${FLAGS[@]}" ;;
esac

# --detach
[ -x "$BIN" ] || { echo "run-apiserver.sh: $BIN not found; run scripts/kube/build.sh" >&2; exit 1; }
START=$(date +%s.%N)
nohup "$BIN" "${FLAGS[@]}" > "$DIR/apiserver.log" 2>&1 < /dev/null &
PID=$!
echo "$PID" > "$DIR/pid"
URL="https://127.0.0.1:$PORT"
curl_k() { curl -sS --max-time 2 --cacert "$DIR/ca.crt" -H "Authorization: Bearer $TOKEN" "$@"; }
DEADLINE=$(( $(date +%s) + 90 ))
until [ "$(curl_k "$URL/readyz" 2>/dev/null)" = ok ] \
        && curl_k -f -o /dev/null "$URL/api/v1/namespaces/default" 2>/dev/null; do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "run-apiserver.sh: kube-apiserver exited; last lines of $DIR/apiserver.log:" >&2
        tail -n 30 "$DIR/apiserver.log" >&2
        exit 1
    fi
    if [ "$(date +%s)" -ge "$DEADLINE" ]; then
        echo "run-apiserver.sh: not ready after 90 s (pid $PID left running; see $DIR/apiserver.log)" >&2
        exit 1
    fi
    sleep 0.1
done
awk -v s="$START" -v e="$(date +%s.%N)" -v pid="$PID" -v port="$PORT" 'BEGIN { printf "ready %.2f pid %s port %s\n", e - s, pid, port }'

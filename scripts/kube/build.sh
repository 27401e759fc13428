#!/usr/bin/env bash
# Builds the Kubernetes test servers and peers for incumbent's Kubernetes Lease
# backend from Go modules (no checkout of kubernetes is needed):
#
#   kube-apiserver      the real API server, k8s.io/kubernetes/cmd/kube-apiserver/app
#                       (module ./apiserver, staging modules pinned by replace)
#   incumbent-k8s-peer  a client-go leaderelection candidate on a Lease (./peer)
#   kube-etcd           only with --etcd: etcd 3.6 from go.etcd.io/etcd/server/v3/etcdmain
#                       (./etcd), named so that it shadows no etcd on PATH;
#                       Debian's etcd 3.4 works with kube-apiserver too (README.md)
#
# Usage: scripts/kube/build.sh [OUT_DIR] [--etcd]
#   OUT_DIR defaults to ${INCUMBENT_TOOLS_DIR:-$HOME/.cache/incumbent-tools}/bin.
# A binary is skipped when OUT_DIR/.NAME.stamp matches its pinned version and
# the hash of its module's go.mod, go.sum and main.go (and the Go version).
# Builds run one at a time with `go build -p ${GO_BUILD_P:-2} -trimpath`, in the
# default module cache (GOPATH). The modules need Go >= 1.26.0 (go.mod says so);
# no GOTOOLCHAIN change is needed on Go 1.26.x.
#
# Cold cost on 2 cores: kube-apiserver about 6-7 minutes (see README.md), the
# peer well under a minute; module downloads about 250 MB.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT=""
WITH_ETCD=0
for arg in "$@"; do
    case "$arg" in
        --etcd) WITH_ETCD=1 ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) OUT="$arg" ;;
    esac
done
OUT="${OUT:-${INCUMBENT_TOOLS_DIR:-$HOME/.cache/incumbent-tools}/bin}"
P="${GO_BUILD_P:-2}"
mkdir -p "$OUT"

command -v go >/dev/null || { echo "build.sh: go not found on PATH" >&2; exit 1; }
GOVERSION="$(go env GOVERSION)"

# module version of $2 as required in $1/go.mod
pinned() { awk -v m="$2" '$1 == m && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$1/go.mod"; }

# build NAME MODULE_DIR VERSION [LDFLAGS]
build() {
    local name="$1" dir="$2" version="$3" ldflags="${4:-}"
    local stamp_file="$OUT/.$name.stamp" hash stamp start secs
    hash="$(cat "$dir/go.mod" "$dir/go.sum" "$dir/main.go" | sha256sum | cut -c1-16)"
    stamp="$name $version $GOVERSION $hash"
    if [ -x "$OUT/$name" ] && [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ]; then
        echo "$name: up to date ($version, $OUT/$name)"
        return
    fi
    echo "$name: building $version with $GOVERSION (go build -p $P -trimpath) ..."
    start=$(date +%s)
    # -mod=readonly: go.mod/go.sum are the pins; a build never rewrites them.
    (cd "$dir" && go build -p "$P" -mod=readonly -trimpath -ldflags "-s -w $ldflags" -o "$OUT/.$name.tmp" .)
    mv -f "$OUT/.$name.tmp" "$OUT/$name"
    echo "$stamp" > "$stamp_file"
    secs=$(( $(date +%s) - start ))
    echo "$name: built in ${secs}s, $(du -h "$OUT/$name" | cut -f1), $OUT/$name"
}

K8S="$(pinned "$HERE/apiserver" k8s.io/kubernetes)"
K8S_MINOR="$(echo "$K8S" | cut -d. -f2)"
V=k8s.io/component-base/version
build kube-apiserver "$HERE/apiserver" "$K8S" \
    "-X $V.gitVersion=$K8S -X $V.gitMajor=1 -X $V.gitMinor=$K8S_MINOR -X $V.gitTreeState=clean"

build incumbent-k8s-peer "$HERE/peer" "client-go $(pinned "$HERE/peer" k8s.io/client-go)"

if [ "$WITH_ETCD" = 1 ]; then
    ETCD="$(pinned "$HERE/etcd" go.etcd.io/etcd/server/v3)"
    build kube-etcd "$HERE/etcd" "$ETCD" "-X go.etcd.io/etcd/api/v3/version.GitSHA=module-$ETCD"
fi

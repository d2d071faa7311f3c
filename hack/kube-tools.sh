#!/usr/bin/env bash
# kube-tools.sh builds the etcd and kube-apiserver binaries that the integration
# tests run, from the versions pinned in hack/tools/kube/go.mod, into a cache
# outside the repository. It is idempotent: a binary whose stamp matches the
# pinned versions is reused, so only the first run pays for the build (about
# 1 min for etcd and 5 min for kube-apiserver on 2 cores, more when the
# module downloads are slow).
#
# On success it prints, on stdout, one NAME=PATH line per binary:
#   ETCD=/root/.cache/kube-userspace-proxy/bin/etcd
#   KUBE_APISERVER=/root/.cache/kube-userspace-proxy/bin/kube-apiserver
# Progress goes to stderr, build durations to $KUBE_TOOLS_BIN/build.log.
#
# Environment:
#   KUBE_TOOLS_BIN   where binaries go
#                    (default ${XDG_CACHE_HOME:-$HOME/.cache}/kube-userspace-proxy/bin)
#   KUBE_TOOLS_NICE  niceness of the builds (default 10; 0 for none)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mod="$here/tools/kube"
bin=${KUBE_TOOLS_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-userspace-proxy/bin}
niceness=${KUBE_TOOLS_NICE:-10}

log() { printf 'kube-tools: %s\n' "$*" >&2; }

# version MODULE prints the version go.mod pins for MODULE.
version() {
	(cd "$mod" && go list -m -f '{{.Version}}' "$1")
}

etcd_version=$(version go.etcd.io/etcd/server/v3)
kube_version=$(version k8s.io/kubernetes)
# The stamp names the versions and the hash of the dependency graph, so a
# change to either go.mod or go.sum rebuilds.
deps=$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-16)

mkdir -p "$bin"
# One build at a time: concurrent test binaries may all find the cache empty.
exec 9>"$bin/.lock"
flock 9

# build NAME PACKAGE STAMP [go build flags...] builds PACKAGE into $bin/NAME
# unless $bin/NAME.stamp already holds STAMP.
build() {
	local name=$1 pkg=$2 stamp=$3
	shift 3
	if [[ -x "$bin/$name" && -f "$bin/$name.stamp" && "$(cat "$bin/$name.stamp")" == "$stamp" ]]; then
		log "$name: cached ($stamp)"
		return
	fi
	log "$name: building $stamp (this takes minutes on a cold cache)"
	local start=$SECONDS tmp="$bin/.$name.tmp"
	rm -f "$tmp"
	(cd "$mod" && CGO_ENABLED=0 nice -n "$niceness" go build -o "$tmp" "$@" "$pkg")
	mv -f "$tmp" "$bin/$name"
	printf '%s\n' "$stamp" >"$bin/$name.stamp"
	local took=$((SECONDS - start))
	log "$name: built in ${took}s"
	printf '%s %s %s %ds\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$name" "$stamp" "$took" >>"$bin/build.log"
}

build etcd go.etcd.io/etcd/server/v3 "etcd $etcd_version $deps"

# kube-apiserver reports its version from ldflags; without them it says
# v0.0.0-master and clients such as kubectl refuse to parse it.
major=${kube_version#v}
major=${major%%.*}
minor=${kube_version#v*.}
minor=${minor%%.*}
vpkg=k8s.io/component-base/version
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "kube-apiserver $kube_version $deps" \
	-ldflags "-X $vpkg.gitVersion=$kube_version -X $vpkg.gitMajor=$major -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"

printf 'ETCD=%s\n' "$bin/etcd"
printf 'KUBE_APISERVER=%s\n' "$bin/kube-apiserver"

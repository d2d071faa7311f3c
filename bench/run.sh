#!/usr/bin/env bash
# Runs the side-by-side benchmark of kube-userspace-proxy against its peers
# (no proxy, HAProxy, nginx stream, socat, a minimal Go io.Copy proxy), all on
# 127.0.0.1. Usage, from anywhere:
#
#   bench/run.sh            # the full run, about 2-3 minutes on 2 cores
#   bench/run.sh -short     # a smoke run, about 30 seconds (45 with builds)
#   bench/run.sh -peers none,haproxy -tests latency
#   bench/run.sh -base main -rounds 6 -tests connrate,udp
#
# -base REF (first) builds the git revision REF as well and runs it as the
# peer kube-userspace-proxy-base, beside the working tree's build, to
# compare the two; without -peers, only those two run. Every other
# argument is handed to bin/bench/loadgen; see `bin/bench/loadgen -h`.
# -tests takes groups: throughput, connrate, latency, udp, idle.
# Missing peers are installed with apt-get when we are root; a peer that
# cannot be installed is reported as unavailable and the others still run.
set -euo pipefail

cd "$(dirname "$0")/.."

log() { printf 'bench: %s\n' "$*" >&2; }

# nginx_has_stream succeeds when nginx can load or already has the stream
# module.
nginx_has_stream() {
	[ -e /usr/lib/nginx/modules/ngx_stream_module.so ] && return 0
	command -v nginx >/dev/null 2>&1 && nginx -V 2>&1 | grep -q -- '--with-stream\( \|$\)'
}

# stop_service_started_by_install stops a daemon that a package's maintainer
# script started (Debian starts nginx on port 80 after installing it unless
# policy-rc.d forbids it). It signals only the pid named in the pid file and
# only when that process really is the named program.
stop_service_started_by_install() {
	local name=$1 pidfile=$2 pid i
	[ -s "$pidfile" ] || return 0
	pid=$(head -n1 "$pidfile" | tr -cd '0-9')
	[ -n "$pid" ] || return 0
	if [ -r "/proc/$pid/comm" ] && grep -qx "$name" "/proc/$pid/comm"; then
		log "stopping the system $name (pid $pid) that its package started"
		kill -QUIT "$pid" 2>/dev/null || true
		for i in $(seq 1 50); do
			kill -0 "$pid" 2>/dev/null || return 0
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
	fi
}

install_peers() {
	local need=() created_policy=""
	command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
	command -v nginx >/dev/null 2>&1 || need+=(nginx)
	nginx_has_stream || need+=(libnginx-mod-stream)
	command -v socat >/dev/null 2>&1 || need+=(socat)
	[ ${#need[@]} -eq 0 ] && return 0

	if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
		log "missing ${need[*]} and cannot install (need root and apt-get); those peers will be reported as unavailable"
		return 0
	fi
	log "installing ${need[*]}"
	# Keep maintainer scripts from starting system daemons (nginx would
	# listen on port 80), the standard Debian way: a policy-rc.d that
	# answers 101. Only create it when the host has none.
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 0755 /usr/sbin/policy-rc.d
		created_policy=1
	fi
	if ! { apt-get update -qq &&
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }; then
		log "could not install ${need[*]}; the peers still missing will be reported as unavailable"
	fi
	if [ -n "$created_policy" ]; then
		rm -f /usr/sbin/policy-rc.d
	fi
	stop_service_started_by_install nginx /run/nginx.pid
	stop_service_started_by_install haproxy /run/haproxy.pid
}

base_ref=""
case "${1:-}" in
-base | --base)
	[ $# -ge 2 ] || { log "-base needs a git revision"; exit 2; }
	base_ref=$2
	shift 2
	;;
-base=* | --base=*)
	base_ref=${1#*=}
	shift
	;;
esac

install_peers

log "building the load generator, backends and go-iocopy"
go build -o bin/bench/ ./bench/cmd/...

# Built as `make build` builds it (stamped with the version), into
# bin/bench/, so the binary `make build` made keeps its own stamp.
proxy=bin/bench/kube-userspace-proxy
log "building $proxy"
if ! make --no-print-directory -s build PROXY="$proxy"; then
	log "cannot build ./cmd/kube-userspace-proxy; benchmarking the other peers only"
	proxy=""
fi

# build_base builds the git revision $1 as make build would, from a
# temporary worktree, into bin/bench/base/.
build_base() {
	local ref=$1 tree
	tree=$(mktemp -d)
	if ! git worktree add -q --detach "$tree" "$ref"; then
		rmdir "$tree"
		log "-base: no git revision $ref"
		return 1
	fi
	log "building $ref as bin/bench/base/kube-userspace-proxy"
	local rc=0
	make --no-print-directory -s -C "$tree" build PROXY="$PWD/bin/bench/base/kube-userspace-proxy" || rc=$?
	git worktree remove --force "$tree"
	return $rc
}

base_args=()
if [ -n "$base_ref" ]; then
	build_base "$base_ref" || exit 1
	base_args=(-proxy-base=bin/bench/base/kube-userspace-proxy)
	case " $* " in
	*" -peers"* | *" --peers"*) ;;
	*) base_args+=(-peers=kube-userspace-proxy,kube-userspace-proxy-base) ;;
	esac
fi

exec bin/bench/loadgen -proxy="$proxy" -json=bench/results/latest.json "${base_args[@]}" "$@"

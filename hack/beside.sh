#!/usr/bin/env bash
# beside.sh runs two jobs at once: BESIDE, a shell command, at the lowest
# CPU priority (nice 19), while MAIN runs as usual. `make test` uses it to
# do its compile-only work while tests that mostly wait run: the build of
# kube-apiserver and etcd beside the unit tests; the vets for other systems,
# staticcheck and the SCTP VM's binaries beside the integration tests. The
# compiles take the CPU those tests leave idle and yield it whenever they
# want it.
#
# Usage: beside.sh BESIDE -- MAIN [ARG...]
#
# MAIN's output goes through as it comes; BESIDE's is kept and printed once
# MAIN ends, so the two never interleave, under a line that says how long
# each took. If MAIN fails, BESIDE is stopped and what it printed so far is
# shown. The exit status is MAIN's when it failed, else BESIDE's.
set -euo pipefail

if (($# < 3)) || [[ "$2" != -- ]]; then
	echo "usage: beside.sh BESIDE -- MAIN [ARG...]" >&2
	exit 2
fi
beside=$1
shift 2

log=$(mktemp)
took=$(mktemp)
# Its own process group, so that stopping it stops the go commands under it.
# It writes how long it took to $took.
setsid -w nice -n 19 bash -c 'bash -c "$1"; s=$?; echo "$SECONDS" >"$2"; exit $s' beside "$beside" "$took" \
	>"$log" 2>&1 </dev/null &
pid=$!
stop() {
	# Before it has made its group, it has nothing under it yet.
	kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}
trap 'stop; rm -f "$log" "$took"' EXIT
trap 'exit 130' INT TERM

status=0
"$@" || status=$?
main_took=$SECONDS

show() {
	echo "---- $1: $beside"
	cat "$log"
	echo "---- end of: $beside"
}
if ((status != 0)); then
	stop
	show "stopped, since $* failed (exit $status)"
	exit "$status"
fi
bstatus=0
wait "$pid" || bstatus=$?
if ((bstatus != 0)); then
	show "FAILED (exit $bstatus), run beside $*"
	exit "$bstatus"
fi
show "passed in $(cat "$took")s (beside $*, ${main_took}s)"

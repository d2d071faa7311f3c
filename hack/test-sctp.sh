#!/usr/bin/env bash
# test-sctp.sh runs the SCTP tests against a real kernel SCTP stack. The host
# kernel has none, so they run in a qemu VM (TCG, no KVM) booted with Debian's
# cloud kernel, whose sctp.ko the VM loads. `make test-sctp` calls this. On a
# fresh machine it installs qemu (as root), fetches the kernel once into
# ~/.cache (later runs are offline), builds static test binaries of
# $SCTP_PKGS and the proxy, and boots the VM once for all of them. In the VM
# SCTP_REQUIRED=1, so a missing SCTP stack fails the tests instead of
# skipping them. See hack/sctpvm/run-vm.sh for the VM itself.
#
# The last line is "sctpvm: N passed, N failed, N skipped" (top-level tests).
# Exit status: 0 all passed; 1 a test failed or none ran; 125 the VM gave no
# result (panic, hang, VM_TIMEOUT); 2 a usage error. Without root and without
# qemu it skips (exit 0), except under CI=true, where it fails.
#
# Environment (and those of hack/sctpvm/run-vm.sh: VM_MODULES, VM_TIMEOUT,
# VM_MEM, VM_APPEND, ACCEL, VM_LOG, KDIR):
#   SCTP_PKGS         packages whose tests run in the VM (default
#                     "./internal/sctp ./userspace ./integration"; none for
#                     none). ./integration is built with -tags integration. A
#                     package that does not exist or has no tests is skipped.
#   SCTP_EXTRA_TESTS  prebuilt static test binaries (*.test) to run as well,
#                     space-separated
#   SCTP_TESTFLAGS    arguments for every test binary (default
#                     "-test.v -test.run=SCTP -test.timeout=360s"); keep
#                     -test.timeout below VM_TIMEOUT (default 420s)
#   SCTPVM_BUILD      build directory (default bin/sctpvm, not committed)
#   SCTP_BUILD_ONLY   1: install qemu, fetch the kernel and build the
#                     binaries, then exit 0 without booting (`make test`
#                     does this beside the integration tests, so that its
#                     later run only links)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
export SCTPVM_BUILD=${SCTPVM_BUILD:-$root/bin/sctpvm}
build=$SCTPVM_BUILD
pkgs=${SCTP_PKGS:-./internal/sctp ./userspace ./integration}
[[ "$pkgs" != none ]] || pkgs=
read -r -a testflags <<<"${SCTP_TESTFLAGS:--test.v -test.run=SCTP -test.timeout=360s}"

say() { printf 'test-sctp: %s\n' "$*" >&2; }
started=$SECONDS
lap() { say "$1 (${2}s)"; }

# qemu. Never KVM: run-vm.sh defaults to TCG.
if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
	if [[ "$(id -u)" == 0 ]]; then
		say "installing qemu-system-x86"
		t=$SECONDS
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
		lap "qemu installed" $((SECONDS - t))
	elif [[ "${CI:-}" == true ]]; then
		say "error: qemu-system-x86_64 is missing and only root can install it (apt-get install qemu-system-x86)"
		exit 1
	else
		echo "skipping SCTP VM tests: qemu-system-x86_64 is not installed (run as root to install)"
		exit 0
	fi
fi

mkdir -p "$build"
# One run at a time: runs share $build, and two TCG VMs on 2 cores each
# take twice as long.
exec 9>"$build/.lock"
if ! flock -n 9; then
	say "another test-sctp run holds $build/.lock; waiting"
	flock 9
fi

t=$SECONDS
if [[ -z "${KDIR:-}" ]]; then
	KDIR=$("$here/sctpvm/fetch-kernel.sh" | tail -n1)
fi
export KDIR
lap "kernel ready: $KDIR" $((SECONDS - t))

t=$SECONDS
rm -rf "$build/tests"
mkdir -p "$build/tests"
cd "$root"
tests=()
for pkg in $pkgs; do
	tags=()
	[[ "$pkg" == ./integration* ]] && tags=(-tags integration)
	# go list -e reports a missing package as one with no test files.
	n=$(go list -e "${tags[@]}" -f '{{len .TestGoFiles}} {{len .XTestGoFiles}}' "$pkg" 2>/dev/null | awk '{s += $1 + $2} END {print s + 0}')
	if ((n == 0)); then
		say "$pkg: no test files (or no such package yet): skipped"
		continue
	fi
	name=${pkg#./}
	out=$build/tests/${name//\//_}.test
	CGO_ENABLED=0 go test -c -trimpath -ldflags="-s -w" "${tags[@]}" -o "$out" "$pkg"
	if [[ ! -f "$out" ]]; then
		say "$pkg: go test -c wrote no binary (no tests): skipped"
		continue
	fi
	tests+=("$out")
done
for extra in ${SCTP_EXTRA_TESTS:-}; do
	[[ -f "$extra" ]] || {
		say "SCTP_EXTRA_TESTS: $extra not found"
		exit 2
	}
	tests+=("$extra")
done
# Stripped: a smaller initramfs boots sooner under emulation.
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$build/kube-userspace-proxy" ./cmd/kube-userspace-proxy
lap "built ${#tests[@]} test binaries and the proxy" $((SECONDS - t))

if ((${#tests[@]} == 0)); then
	say "error: nothing to test: no package in SCTP_PKGS='$pkgs' has tests, and SCTP_EXTRA_TESTS is empty"
	echo "sctpvm: 0 passed, 0 failed, 0 skipped"
	exit 1
fi

if [[ "${SCTP_BUILD_ONLY:-}" == 1 ]]; then
	say "SCTP_BUILD_ONLY=1: built in $((SECONDS - started))s; not booting"
	exit 0
fi
say "$((SECONDS - started))s before boot"
# run-vm.sh prints the closing count line and exits with the result.
exec "$here/sctpvm/run-vm.sh" -file "$build/kube-userspace-proxy:/bin/kube-userspace-proxy" \
	"${tests[@]}" -- "${testflags[@]}"

#!/usr/bin/env bash
# run-vm.sh boots Debian's kernel under qemu (TCG software emulation) with an
# initramfs holding the given static test binaries, runs them there (see
# hack/sctpvm/vminit), and exits with their result: 0 if all passed, 1 if
# any failed, 125 if the VM printed no result (kernel panic, hang, timeout).
# The serial console is shown and saved; the last line is
#
#   sctpvm: N passed, N failed, N skipped
#
# counting top-level tests only (the "--- PASS:" lines that start a line;
# subtests are indented). A run in which no test passed or failed is a failure.
#
# Usage: run-vm.sh [-file HOST:GUEST]... TEST.test... [-- TEST_ARGS...]
#
# Test binaries must be static (CGO_ENABLED=0 go test -c). TEST_ARGS reach
# every binary through the kernel command line: no spaces inside one
# argument, about 2 KiB in all. -test.v is added if missing, for the counts.
#
# Environment:
#   KDIR          unpacked kernel tree (default: hack/sctpvm/fetch-kernel.sh,
#                 which fetches it once into ~/.cache)
#   VM_MODULES    comma-separated modules to load: names or aliases, with
#                 their dependencies (default sctp,dummy; dummy only if the
#                 kernel has it); none loads nothing, the negative control
#   VM_TIMEOUT    seconds before the VM is killed (default 420). From 30 up,
#                 vminit also stops a test binary still running 10 s before
#                 that (SIGQUIT: goroutine dump) and runs no further ones, so
#                 the run still ends with a result
#   VM_MEM        guest memory (default 1024M)
#   VM_APPEND     extra kernel parameters; KEY=VALUE ones whose KEY has no
#                 dot reach the tests' environment
#   ACCEL         qemu accelerator (default tcg). Never kvm by default: where
#                 /dev/kvm exists without hardware virtualisation it is ~100x slower
#   SCTPVM_BUILD  work directory for vminit, mkinitramfs and the initramfs
#                 (default bin/sctpvm in the repository)
#   VM_LOG        serial log file (default $SCTPVM_BUILD/serial.log)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${SCTPVM_BUILD:-$root/bin/sctpvm}
log=${VM_LOG:-$build/serial.log}
vm_timeout=${VM_TIMEOUT:-420}
accel=${ACCEL:-tcg}
mem=${VM_MEM:-1024M}

say() { printf 'sctpvm: %s\n' "$*" >&2; }
usage() {
	say "usage: run-vm.sh [-file HOST:GUEST]... TEST.test... [-- TEST_ARGS...]"
	exit 2
}

files=()
tests=()
targs=()
while (($#)); do
	case $1 in
	-file)
		(($# >= 2)) || usage
		files+=(-file "$2")
		shift 2
		;;
	--)
		shift
		targs=("$@")
		break
		;;
	-*) usage ;;
	*)
		tests+=("$1")
		shift
		;;
	esac
done
((${#tests[@]})) || usage
[[ "$vm_timeout" =~ ^[0-9]+$ ]] || {
	say "VM_TIMEOUT must be whole seconds, got '$vm_timeout'"
	exit 2
}

command -v qemu-system-x86_64 >/dev/null 2>&1 || {
	say "qemu-system-x86_64 not found (apt-get install qemu-system-x86; hack/test-sctp.sh does that)"
	exit 2
}

# The counts below need -test.v.
verbose=
for a in "${targs[@]}"; do
	[[ "$a" == -test.v* || "$a" == --test.v* ]] && verbose=1
done
[[ -n "$verbose" ]] || targs=(-test.v "${targs[@]}")
# The kernel splits its command line at spaces; everything after "--" is
# the tests' argv (vminit reads it from /proc/cmdline).
for a in "${targs[@]}"; do
	if [[ "$a" == *[[:space:]\"]* || -z "$a" ]]; then
		say "test argument '$a' is empty or holds a space or quote, which the kernel command line cannot carry"
		exit 2
	fi
done

if [[ -z "${KDIR:-}" ]]; then
	KDIR=$("$here/fetch-kernel.sh" | tail -n1)
fi
vmlinuz=$(compgen -G "$KDIR/boot/vmlinuz-*" | head -n1) || true
[[ -n "$vmlinuz" ]] || {
	say "no boot/vmlinuz-* in KDIR=$KDIR"
	exit 2
}
release=${vmlinuz##*/vmlinuz-}
moddir=$KDIR/lib/modules/$release

modules=${VM_MODULES-}
if [[ -z "$modules" ]]; then
	modules=sctp
	# dummy lets tests create links without ip(8).
	if [[ -f "$moddir/kernel/drivers/net/dummy.ko" ]] ||
		grep -qs '/dummy\.ko$' "$moddir/modules.builtin"; then
		modules=sctp,dummy
	else
		say "this kernel has no dummy module: loading only sctp"
	fi
fi
if [[ "$modules" == none ]]; then
	say "VM_MODULES=none: loading no modules (SCTP tests must fail)"
fi

mkdir -p "$build" "$(dirname "$log")"
(
	cd "$root"
	GOOS=linux GOARCH=amd64 CGO_ENABLED=0 go build -trimpath -o "$build/vminit" ./hack/sctpvm/vminit
	CGO_ENABLED=0 go build -trimpath -o "$build/mkinitramfs" ./hack/sctpvm/mkinitramfs
)
"$build/mkinitramfs" -o "$build/initrd.cpio" -init "$build/vminit" \
	-moddir "$moddir" -modules "$modules" "${files[@]}" "${tests[@]}"

# vminit stops the tests at SCTPVM_BUDGET seconds of guest uptime, so that
# binaries whose -test.timeout values add up past VM_TIMEOUT still end with
# a goroutine dump and a result rather than a kill. The margin covers qemu's
# start before the kernel clock runs, and the power-off.
budget=
if ((vm_timeout >= 30)); then
	budget="SCTPVM_BUDGET=$((vm_timeout - 10))"
fi
append="console=ttyS0 panic=-1 mitigations=off quiet $budget ${VM_APPEND:-} -- ${targs[*]}"
if ((${#append} > 2000)); then
	say "kernel command line is ${#append} bytes; x86 allows 2048"
	exit 2
fi

say "booting $(basename "$vmlinuz") (accel $accel, timeout ${vm_timeout}s, modules $modules)"
start=$SECONDS
set +e
timeout -k 5 "$vm_timeout" qemu-system-x86_64 -accel "$accel" -M pc -m "$mem" -smp 1 \
	-nodefaults -no-user-config -display none -no-reboot -serial stdio -net none \
	-kernel "$vmlinuz" -initrd "$build/initrd.cpio" \
	-append "$append" </dev/null 2>&1 | tr -d '\r' | tee "$log"
qemu_status=${PIPESTATUS[0]}
set -e
took=$((SECONDS - start))

# Serial output may carry stray bytes; -a keeps grep reading it as text.
marker=$(grep -aoE 'SCTPVM-RESULT exit=[0-9]+' "$log" | tail -n1) || true
count() { grep -acE "^--- $1: " "$log" || true; }
passed=$(count PASS)
failed=$(count FAIL)
skipped=$(count SKIP)

if [[ -z "$marker" ]]; then
	case $qemu_status in
	124 | 137) say "no result: the VM was killed after VM_TIMEOUT=${vm_timeout}s" ;;
	*) say "no result: the VM stopped without printing one (qemu exit $qemu_status; kernel panic or vminit crash?)" ;;
	esac
	status=125
else
	status=${marker##*=}
	if grep -aqE '^(panic: |SIGQUIT: quit)' "$log"; then
		say "a test binary panicked or timed out (see the log): the test it was running has no --- FAIL line, so the count below misses it"
	elif ((status != 0 && failed == 0)); then
		say "the VM reports a failure without any --- FAIL line: a setup error or a failure outside a test (see the log)"
	fi
	if ((status == 0 && passed + failed == 0)); then
		say "no test ran (is -test.run right, and do the binaries have SCTP tests?): failing"
		status=1
	fi
fi
say "VM took ${took}s; serial log in $log"
echo "sctpvm: $passed passed, $failed failed, $skipped skipped"
exit "$status"

#!/usr/bin/env bash
# fetch-kernel.sh unpacks Debian's cloud kernel (which builds SCTP as a
# module) into a cache outside the repository, for the qemu VM in which
# hack/test-sctp.sh runs the SCTP tests. The package is downloaded with
# `apt-get download` and unpacked with `dpkg-deb -x`; it is never installed.
#
# The metapackage linux-image-$KERNEL_FLAVOUR is resolved at fetch time to
# the ABI package it currently depends on (linux-image-6.1.0-NN-cloud-amd64):
# superseded ABI packages leave the mirror, so a pinned name would rot.
# A cached tree is reused as it is, without network, until
# SCTPVM_KERNEL_REFRESH=1 asks for the current package again.
#
# On success the last line on stdout is the kernel tree, which holds
# boot/vmlinuz-RELEASE, lib/modules/RELEASE/ and .pkg (what was fetched).
# Progress goes to stderr.
#
# Usage: fetch-kernel.sh [DIR]
#
# Environment:
#   KERNEL_FLAVOUR         Debian kernel flavour (default cloud-amd64; amd64 is
#                          the generic one, which also works)
#   SCTPVM_CACHE           cache root (default
#                          ${XDG_CACHE_HOME:-$HOME/.cache}/kube-userspace-proxy/sctpvm)
#   SCTPVM_KERNEL_REFRESH  1: fetch again even if a kernel is cached
set -euo pipefail

flavour=${KERNEL_FLAVOUR:-cloud-amd64}
cache=${SCTPVM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-userspace-proxy/sctpvm}
dir=${1:-$cache/kernel-$flavour}
meta=linux-image-$flavour

log() { printf 'fetch-kernel: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# complete DIR succeeds if DIR holds an unpacked kernel with sctp.ko.
complete() {
	[[ -f "$1/.pkg" ]] &&
		compgen -G "$1/boot/vmlinuz-*" >/dev/null &&
		compgen -G "$1/lib/modules/*/kernel/net/sctp/sctp.ko" >/dev/null
}

if [[ "${SCTPVM_KERNEL_REFRESH:-}" != 1 ]] && complete "$dir"; then
	log "cached: $(tr '\n' ' ' <"$dir/.pkg")"
	printf '%s\n' "$dir"
	exit 0
fi

for tool in apt-cache apt-get dpkg-deb; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool not found: a Debian-based host is needed to fetch the guest kernel"
done

mkdir -p "$(dirname "$dir")"
# One fetch at a time: a second caller waits and then finds the cache filled.
exec 9>"$dir.lock"
flock 9
if [[ "${SCTPVM_KERNEL_REFRESH:-}" != 1 ]] && complete "$dir"; then
	log "cached (fetched meanwhile): $(tr '\n' ' ' <"$dir/.pkg")"
	printf '%s\n' "$dir"
	exit 0
fi

updated=
# update refreshes the apt lists once, as root; without root it cannot.
update() {
	[[ -z "$updated" ]] || return 1
	[[ "$(id -u)" == 0 ]] || return 1
	log "apt-get update"
	apt-get update -qq >&2
	updated=1
}

# The lists are missing on a fresh image, and a week-old list likely
# names an ABI package the mirror no longer has.
lists=/var/lib/apt/lists
if ! compgen -G "$lists/*_Packages*" >/dev/null ||
	[[ -z "$(find "$lists" -maxdepth 1 -name '*_Packages*' -mtime -7 -print -quit)" ]]; then
	update || log "apt lists missing or older than a week and not root: trying them as they are"
fi

# resolve prints the ABI package that the metapackage's candidate depends on.
resolve() {
	apt-cache depends "$meta" 2>/dev/null |
		sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n1
}

pkg=$(resolve)
if [[ -z "$pkg" ]] && update; then
	pkg=$(resolve)
fi
[[ -n "$pkg" ]] || die "cannot resolve $meta to a kernel package (apt-cache depends $meta found none; run apt-get update as root)"
log "$meta -> $pkg"

tmp=$(mktemp -d "$dir.tmp.XXXXXX")
dl=$(mktemp -d)
trap 'rm -rf "$tmp" "$dl"' EXIT
# apt-get download as root drops privileges to _apt, which must be able to
# reach and write the directory it downloads into (otherwise it warns and
# downloads unsandboxed). $HOME is often mode 0700, so use $TMPDIR.
if [[ "$(id -u)" == 0 ]] && id _apt >/dev/null 2>&1; then
	chown _apt "$dl"
fi

download() { (cd "$dl" && apt-get download -q "$pkg" >&2); }
start=$SECONDS
if ! download; then
	# A stale list names a version the mirror has dropped: update, retry.
	update || die "apt-get download $pkg failed"
	pkg=$(resolve)
	[[ -n "$pkg" ]] || die "cannot resolve $meta after apt-get update"
	download || die "apt-get download $pkg failed"
fi
deb=$(compgen -G "$dl/*.deb" | head -n1) || true
[[ -n "$deb" ]] || die "apt-get download $pkg left no .deb"
version=$(dpkg-deb -f "$deb" Version)
log "unpacking $(basename "$deb")"
dpkg-deb -x "$deb" "$tmp/tree"

vmlinuz=$(compgen -G "$tmp/tree/boot/vmlinuz-*" | head -n1) || true
[[ -n "$vmlinuz" ]] || die "$pkg has no boot/vmlinuz-*"
release=${vmlinuz##*/vmlinuz-}
mods=$tmp/tree/lib/modules/$release
if [[ ! -f "$mods/kernel/net/sctp/sctp.ko" ]]; then
	if compgen -G "$mods/kernel/net/sctp/sctp.ko.*" >/dev/null; then
		die "$pkg ships compressed modules ($(basename "$(compgen -G "$mods/kernel/net/sctp/sctp.ko.*")")); mkinitramfs reads only plain .ko"
	fi
	die "$pkg has no kernel/net/sctp/sctp.ko (is CONFIG_IP_SCTP=m?)"
fi
# usr/ holds only docs, bug-report and lintian files, which the VM never needs.
rm -rf "$tmp/tree/usr"
printf 'package=%s\nversion=%s\nrelease=%s\nfetched=%s\n' \
	"$pkg" "$version" "$release" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$tmp/tree/.pkg"

rm -rf "$dir"
mv "$tmp/tree" "$dir"
log "fetched $pkg $version (release $release) in $((SECONDS - start))s into $dir"
printf '%s\n' "$dir"

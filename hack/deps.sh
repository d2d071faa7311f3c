#!/usr/bin/env bash
# Installs the Debian packages the tests use as real clients (curl, nc) and
# kernel tools (iproute2, iptables, conntrack) when they are missing. As
# root it installs them; otherwise it says what is missing. Under CI=true a
# missing package it cannot install is an error.
set -euo pipefail

need=()
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v nc >/dev/null 2>&1 || need+=(netcat-openbsd)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# The portal and conntrack tests: iptables (both backends) and conntrack.
command -v iptables-legacy >/dev/null 2>&1 || need+=(iptables)
command -v conntrack >/dev/null 2>&1 || need+=(conntrack)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  echo "deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  exit 0
fi
if [ "${CI:-}" = true ]; then
  echo "deps: missing ${need[*]} and not root: cannot install under CI" >&2
  exit 1
fi
echo "deps: missing ${need[*]}; tests that use them will skip (run as root to install)" >&2

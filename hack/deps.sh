#!/usr/bin/env bash
# Installs the Debian packages the tests use as real clients (curl, nc),
# kernel tools (iproute2, iptables, conntrack) and real servers (nginx with
# its stream module, the PROXY protocol parser the integration tests check
# headers with) when they are missing. As root it installs them; otherwise
# it says what is missing. Under CI=true a missing package it cannot
# install is an error.
set -euo pipefail

need=()
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v nc >/dev/null 2>&1 || need+=(netcat-openbsd)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# The portal and conntrack tests: iptables (both backends) and conntrack.
command -v iptables-legacy >/dev/null 2>&1 || need+=(iptables)
command -v conntrack >/dev/null 2>&1 || need+=(conntrack)
# The PROXY protocol tests: nginx's stream module, loaded dynamically.
command -v nginx >/dev/null 2>&1 || need+=(nginx)
[ -e /usr/lib/nginx/modules/ngx_stream_module.so ] || need+=(libnginx-mod-stream)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  echo "deps: installing ${need[*]}"
  # Keep maintainer scripts from starting system daemons (nginx would
  # listen on port 80), the standard Debian way: a policy-rc.d that
  # answers 101. Only create it when the host has none.
  created_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    created_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  status=0
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; } || status=$?
  if [ -n "$created_policy" ]; then
    rm -f /usr/sbin/policy-rc.d
  fi
  exit "$status"
fi
if [ "${CI:-}" = true ]; then
  echo "deps: missing ${need[*]} and not root: cannot install under CI" >&2
  exit 1
fi
echo "deps: missing ${need[*]}; tests that use them will skip (run as root to install)" >&2

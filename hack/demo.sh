#!/usr/bin/env bash
# make demo: a scripted tour. Starts the demo backends and the proxy on
# examples/demo.yaml, sends TCP (curl) and UDP traffic through it, prints
# how many requests each backend served, stops everything and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

. hack/demo-lib.sh

pids=()
log=$(mktemp)
blog=$(mktemp)
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -f "$log" "$blog"
}
trap cleanup EXIT

start_backends "$blog"
start_proxy "$log"
grep 'Serving' "$log" | sed 's/^.*\] /proxy: /'

echo
echo "== 12 HTTP requests to demo/web (NodePort 30080, round robin) with curl"
for _ in $(seq 1 12); do curl -fsS --max-time 5 http://127.0.0.1:30080/; done \
  | sed 's/ (.*//' | sort | uniq -c | sed 's/^/  served: /'

echo
echo "== 6 HTTP requests to demo/web-sticky (NodePort 30081, ClientIP affinity)"
for _ in $(seq 1 6); do curl -fsS --max-time 5 http://127.0.0.1:30081/; done \
  | sed 's/ (.*//' | sort | uniq -c | sed 's/^/  served: /'

echo
echo "== 10 UDP datagrams to demo/echo (NodePort 30053), each from a new client port"
bin/demo udp 127.0.0.1:30053 10 | sed 's/:.*//' | sort | uniq -c | sed 's/^/  served: /'

echo
echo "== the proxy's health (/healthz, as kube-proxy answers it)"
if ! curl -sS --max-time 5 -w ' (HTTP %{http_code})\n' http://127.0.0.1:10256/healthz | sed 's/^/  /'; then
  echo "  no answer: another program holds 127.0.0.1:10256? The proxy's log says:"
  # The log is removed on exit: show what it says about the health port.
  grep -E '"(Cannot serve|Stopped serving|Serving) /healthz' "$log" | tail -3 | sed 's/^.*\] /  proxy: /' | grep . \
    || echo "  proxy: (nothing about /healthz)"
fi

echo
echo "demo: done"

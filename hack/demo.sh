#!/usr/bin/env bash
# make demo: a scripted tour. Starts the demo backends and the proxy on
# examples/demo.yaml, sends TCP (curl) and UDP traffic through it, prints
# how many requests each backend served, stops everything and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

# Its HTTP client is curl (the UDP one is bin/demo's own).
if ! command -v curl >/dev/null 2>&1; then
  echo "$0: make demo sends its HTTP requests with curl, which is not installed (apt-get install curl, or make deps as root)" >&2
  exit 1
fi

. hack/demo-lib.sh

demo_start_tmp
start_backends
start_proxy
# From here a Ctrl-C ends the tour at once; demo_stop still waits for the
# proxy and the backends, and removes the logs.
trap 'interrupted=1; exit 130' INT TERM HUP
log=$(proxy_log)
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
# Ask only when the proxy's log says it serves there: another program on
# the port (a kube-proxy on 0.0.0.0:10256) would answer in its place, and
# one that never answers would hold the demo for curl's timeout.
said=$(proxy_serves /healthz) || true
if [[ $said == *'"Serving /healthz'* ]] &&
  answer=$(curl -sS --max-time 5 -w ' (HTTP %{http_code})' http://127.0.0.1:10256/healthz 2>&1); then
  echo "  $answer"
else
  if [[ $said == *'"Serving /healthz'* ]]; then
    echo "  no answer from the proxy on 127.0.0.1:10256. Its log says:"
  else
    echo "  not asked: the proxy does not serve 127.0.0.1:10256 (does another program hold it?). Its log says:"
  fi
  # The log is removed on exit: show what it says about the health port.
  grep -E '"(Cannot serve|Stopped serving|Serving) /healthz' "$log" | tail -3 | sed 's/^.*\] /  proxy: /' | grep . \
    || echo "  proxy: (nothing about /healthz)"
fi

echo
echo "demo: done"

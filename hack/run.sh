#!/usr/bin/env bash
# make run: the proxy in the foreground on examples/demo.yaml, with the demo
# backends beside it. No cluster and no root needed. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/demo-lib.sh

pids=()
blog=$(mktemp)
plog=$(mktemp)
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -f "$blog" "$plog"
}
trap cleanup EXIT

start_backends "$blog"
LOG_TO_TERMINAL=1 start_proxy "$plog" "$@"

cat <<'TXT'

kube-userspace-proxy is serving examples/demo.yaml. In another terminal try:

  curl http://127.0.0.1:30080/          # demo/web: round robin over web-1..3
  curl http://127.0.0.1:30081/          # demo/web-sticky: ClientIP affinity
  echo hi | nc -u -w1 127.0.0.1 30053   # demo/echo: UDP, a new session per client port
  curl http://127.0.0.1:10256/healthz   # the proxy's health, as kube-proxy reports it
  curl http://127.0.0.1:10249/debug/services   # what each service port serves, and where

Each service is also on its proxy port (the "Serving ... via=proxy-port"
lines above). Edit examples/demo.yaml and watch it apply (git checkout
examples/demo.yaml puts it back). Ctrl-C to stop. To see which endpoint
each connection went to and why (round robin, affinity, failover), run
./hack/run.sh -v=4 instead.

TXT
wait "${pids[-1]}"

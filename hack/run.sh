#!/usr/bin/env bash
# make run: the proxy in the foreground on examples/demo.yaml, with the demo
# backends beside it. No cluster and no root needed. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."

backends_pid=
cleanup() {
  if [ -n "$backends_pid" ]; then
    kill "$backends_pid" 2>/dev/null || true
    wait "$backends_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

bin/demo backends &
backends_pid=$!

cat <<'TXT'

kube-userspace-proxy is serving examples/demo.yaml. In another terminal try:

  curl http://127.0.0.1:30080/          # demo/web: round robin over web-1..3
  curl http://127.0.0.1:30081/          # demo/web-sticky: ClientIP affinity
  echo hi | nc -u -w1 127.0.0.1 30053   # demo/echo: UDP, a new session per client port

Each service is also on its proxy port (the "Serving ... via=proxy-port"
lines below). Edit examples/demo.yaml and watch it apply. Ctrl-C to stop.

TXT
bin/kube-userspace-proxy --manifests examples/demo.yaml --portal=none \
  --bind-address=127.0.0.1 --nodeport-addresses=127.0.0.1/32 "$@"

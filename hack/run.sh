#!/usr/bin/env bash
# make run: the proxy in the foreground on examples/demo.yaml, with the demo
# backends beside it. No cluster and no root needed. Ctrl-C stops both,
# after the proxy's last log line.
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/demo-lib.sh

demo_start_tmp
start_backends
LOG_TO_TERMINAL=1 start_proxy "$@"

# Suggest only what this run serves: the health and metrics ports may be
# held by another program (a kube-proxy), which would answer instead.
health=$(proxy_serves /healthz) && health= || health=${health:-"(its log says nothing about /healthz)"}
metrics=$(proxy_serves /metrics) && metrics= || metrics=${metrics:-"(its log says nothing about /metrics)"}

cat <<'TXT'

kube-userspace-proxy is serving examples/demo.yaml. In another terminal try:

  curl http://127.0.0.1:30080/          # demo/web: round robin over web-1..3
  curl http://127.0.0.1:30081/          # demo/web-sticky: ClientIP affinity
  echo hi | nc -u -w1 127.0.0.1 30053   # demo/echo: UDP, a new session per client port
TXT
[ -n "$health" ] ||
  echo "  curl http://127.0.0.1:10256/healthz   # the proxy's health, as kube-proxy reports it"
[ -n "$metrics" ] ||
  echo "  curl http://127.0.0.1:10249/debug/services   # what each service port serves, and where"
for said in "$health" "$metrics"; do
  [ -z "$said" ] || printf '\nNot served by this run (does another program hold the port?):\n  %s\n' "${said#*\] }"
done
cat <<'TXT'

Each service is also on its proxy port (the "Serving ... via=proxy-port"
lines above). Edit examples/demo.yaml and watch it apply (git checkout
examples/demo.yaml puts it back). Ctrl-C to stop. To see which endpoint
each connection went to and why (round robin, affinity, failover), run
./hack/run.sh -v=4 instead.

TXT
wait_proxy

#!/usr/bin/env bash
# make run: the proxy in the foreground on examples/demo.yaml, with the demo
# backends beside it. No cluster and no root needed. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."

pids=()
blog=$(mktemp)
plog=$(mktemp)
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -f "$blog" "$plog"
}
trap cleanup EXIT

bin/demo backends >"$blog" 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do
  grep -q 'demo backends:' "$blog" && break
  sleep 0.1
done
if ! kill -0 "${pids[0]}" 2>/dev/null || ! grep -q '^demo backends: HTTP' "$blog"; then
  echo "make run: the demo backends could not start (is another 'make run' or 'make demo' running?):" >&2
  cat "$blog" >&2
  exit 1
fi

# The proxy's log goes to the terminal as it comes, and to $plog, which
# tells when the three node ports are served.
bin/kube-userspace-proxy --manifests examples/demo.yaml --portal=none \
  --bind-address=127.0.0.1 --nodeport-addresses=127.0.0.1/32 "$@" \
  2> >(tee "$plog" >&2) &
pids+=($!)
for _ in $(seq 1 100); do
  [ "$(grep -c 'via="node-port"' "$plog" || true)" -ge 3 ] && break
  kill -0 "${pids[1]}" 2>/dev/null || break
  sleep 0.1
done
if [ "$(grep -c 'via="node-port"' "$plog" || true)" -lt 3 ]; then
  echo >&2
  echo "make run: the proxy could not open the demo's node ports 30080, 30081 and 30053/udp on 127.0.0.1 (see its log above: is another program, or another 'make run', using them?)" >&2
  exit 1
fi

cat <<'TXT'

kube-userspace-proxy is serving examples/demo.yaml. In another terminal try:

  curl http://127.0.0.1:30080/          # demo/web: round robin over web-1..3
  curl http://127.0.0.1:30081/          # demo/web-sticky: ClientIP affinity
  echo hi | nc -u -w1 127.0.0.1 30053   # demo/echo: UDP, a new session per client port

Each service is also on its proxy port (the "Serving ... via=proxy-port"
lines above). Edit examples/demo.yaml and watch it apply (git checkout
examples/demo.yaml puts it back). Ctrl-C to stop.

TXT
wait "${pids[1]}"

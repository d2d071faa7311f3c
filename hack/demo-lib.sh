# Shared by hack/run.sh (make run) and hack/demo.sh (make demo): start the
# demo backends and the proxy on examples/demo.yaml, and say plainly when
# either cannot open its ports. Callers set pids=() and clean up on exit.

# start_backends LOG: the demo backends, logging to LOG; exits the script
# with their error when they could not start.
start_backends() {
  local log=$1
  bin/demo backends >"$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 50); do
    grep -q 'demo backends:' "$log" && break
    sleep 0.1
  done
  if ! kill -0 "${pids[-1]}" 2>/dev/null || ! grep -q '^demo backends: HTTP' "$log"; then
    echo "$0: the demo backends could not start (is another 'make run' or 'make demo' running?):" >&2
    cat "$log" >&2
    exit 1
  fi
}

# start_proxy LOG [ARGS...]: the proxy on examples/demo.yaml, its log
# written to LOG (and passed to standard error when LOG_TO_TERMINAL is set);
# waits, bounded, until the three node ports are served, else (at the
# first failed sync) exits the script saying why.
start_proxy() {
  local log=$1
  shift
  # Standard error itself, not /dev/stderr: opening that would truncate
  # a file it is redirected to (make run >file 2>&1).
  local echo=2
  [ -n "${LOG_TO_TERMINAL:-}" ] || exec {echo}>/dev/null
  bin/kube-userspace-proxy --manifests examples/demo.yaml --portal=none \
    --bind-address=127.0.0.1 --nodeport-addresses=127.0.0.1/32 \
    --healthz-bind-address=127.0.0.1:10256 "$@" \
    2> >(tee "$log" >&"$echo") &
  pids+=($!)
  local proxy=$!
  for _ in $(seq 1 100); do
    [ "$(grep -c 'via="node-port"' "$log" || true)" -ge 3 ] && return 0
    kill -0 "$proxy" 2>/dev/null || break
    grep -q '"Sync failed' "$log" && break
    sleep 0.1
  done
  echo >&2
  echo "$0: the proxy could not open the demo's node ports 30080, 30081 and 30053/udp on 127.0.0.1 (is another program, or another 'make run', using them?); its log:" >&2
  grep -v 'via=' "$log" | tail -5 >&2
  exit 1
}

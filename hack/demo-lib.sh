# Shared by hack/run.sh (make run) and hack/demo.sh (make demo): start the
# demo backends and the proxy on examples/demo.yaml, say plainly why when
# either cannot serve, and stop them. Callers source it after cd to the
# top of the checkout, and call demo_start_tmp first; it removes what it
# made on exit.

pids=()     # the demo backends and the proxy, stopped on exit
proxy=      # the proxy
logger=     # the tee that writes the proxy's log, which ends after the proxy
proxy_said=    # set once the proxy's exit status was said
tmp=        # the logs
interrupted=

# A Ctrl-C reaches every process of the terminal's process group: the proxy
# and the backends shut down by themselves. The script only notes it, so
# that it waits for them (their last lines are shown, and the proxy does
# not write to a closed pipe), and a second Ctrl-C cannot cut that or the
# cleanup short. SIGTERM and SIGHUP, sent to the script alone, are noted
# the same way; demo_stop passes them on.
trap 'interrupted=1' INT TERM HUP

# demo_start_tmp: the directory for the logs, removed on exit.
demo_start_tmp() {
  tmp=$(mktemp -d)
  trap demo_stop EXIT
}

# demo_stop: stop what was started, wait for it, remove the logs. Exits
# with the status the script had, or the proxy's when that was not 0.
demo_stop() {
  local status=$? p proxy_status=0
  trap 'interrupted=1' INT TERM HUP # (demo.sh's exits)
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    # A noted signal ends wait early: wait again until the process is gone.
    while kill -0 "$p" 2>/dev/null; do wait "$p" 2>/dev/null || true; done
  done
  while [ -n "$logger" ] && kill -0 "$logger" 2>/dev/null; do
    wait "$logger" 2>/dev/null || sleep 0.05
  done
  rm -rf "$tmp"
  # Its status (the shell keeps it once reaped). 143: ended by the SIGTERM
  # above rather than by its own shutdown, which exits 0.
  [ -z "$proxy" ] || [ -n "$proxy_said" ] || { wait "$proxy" && proxy_status=0 || proxy_status=$?; }
  if [ "$proxy_status" != 0 ] && [ "$proxy_status" != 143 ]; then
    echo "$0: the proxy exited with status $proxy_status" >&2
    [ "$status" != 0 ] || status=$proxy_status
  fi
  exit "$status"
}

# stop_if_interrupted: exit (cleaning up) once a signal was noted.
stop_if_interrupted() {
  [ -z "$interrupted" ] || exit 130
}

# start_backends: the demo backends, logging to $tmp/backends.log; exits
# the script with their error when they could not start.
start_backends() {
  local log=$tmp/backends.log
  bin/demo backends >"$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 50); do
    grep -q 'demo backends:' "$log" && break
    stop_if_interrupted
    sleep 0.1
  done
  stop_if_interrupted
  if ! kill -0 "${pids[-1]}" 2>/dev/null || ! grep -q '^demo backends: HTTP' "$log"; then
    echo "$0: the demo backends could not start (is another 'make run' or 'make demo' running?):" >&2
    cat "$log" >&2
    exit 1
  fi
}

# wait_proxy: wait until the proxy exits, or a signal is noted (Ctrl-C,
# which the proxy has too: demo_stop then waits for its shutdown).
wait_proxy() {
  while [ -z "$interrupted" ] && kill -0 "$proxy" 2>/dev/null; do
    wait "$proxy" || true
  done
}

# proxy_log: the proxy's log file.
proxy_log() { echo "$tmp/proxy.log"; }

# start_proxy [ARGS...]: the proxy on examples/demo.yaml, its log written
# to $(proxy_log) (and passed to standard error when LOG_TO_TERMINAL is
# set); waits, bounded, until the three node ports are served, else exits
# the script saying why: the proxy exited (a broken examples/demo.yaml,
# say), a node port is held by another program, or another sync failure.
start_proxy() {
  local log
  log=$(proxy_log)
  : >"$log"
  # Standard error itself, not /dev/stderr: opening that would truncate
  # a file it is redirected to (make run >file 2>&1).
  local echo=2
  [ -n "${LOG_TO_TERMINAL:-}" ] || exec {echo}>/dev/null
  # The log's writer ignores Ctrl-C: it ends when the proxy closes its
  # standard error, after the proxy's last line.
  local to_log
  exec {to_log}> >(trap '' INT; exec tee "$log" >&"$echo")
  logger=$!
  bin/kube-userspace-proxy --manifests examples/demo.yaml --portal=none \
    --bind-address=127.0.0.1 --nodeport-addresses=127.0.0.1/32 \
    --healthz-bind-address=127.0.0.1:10256 "$@" 2>&"$to_log" &
  proxy=$!
  pids+=("$proxy")
  exec {to_log}>&-
  [ "$echo" = 2 ] || exec {echo}>&-

  for _ in $(seq 1 100); do
    [ "$(grep -c 'via="node-port"' "$log" || true)" -ge 3 ] && return 0
    stop_if_interrupted
    kill -0 "$proxy" 2>/dev/null || break
    grep -q '"Sync failed' "$log" && break
    sleep 0.1
  done
  stop_if_interrupted
  echo >&2
  if ! kill -0 "$proxy" 2>/dev/null; then
    # It exited: its status, and its whole log (the writer ends after it).
    local status=0
    wait "$proxy" || status=$?
    proxy_said=1
    while kill -0 "$logger" 2>/dev/null; do wait "$logger" 2>/dev/null || sleep 0.05; done
    if [ -n "${LOG_TO_TERMINAL:-}" ]; then
      echo "$0: the proxy exited (status $status) before it served the demo: see its log above." >&2
    else
      echo "$0: the proxy exited (status $status) before it served the demo. Its log ends:" >&2
      if grep -q '^kube-userspace-proxy: ' "$log"; then
        # Its error, whole: a manifest error names FILE:LINE of each document.
        sed -n '/^kube-userspace-proxy: /,$p' "$log" >&2
      else
        tail -5 "$log" >&2
      fi
    fi
    if grep -q '^kube-userspace-proxy: manifests: examples/demo.yaml' "$log"; then
      echo "$0: examples/demo.yaml does not load (see above); 'git checkout examples/demo.yaml' puts back the bundled one." >&2
    fi
    exit 1
  fi
  local failed
  failed=$(grep '"Sync failed' "$log" | head -1 || true)
  if [[ $failed == *'address already in use'* ]]; then
    local busy
    busy=$(sed -n 's/.*listen on \([^ ]*\) (node-port): address already in use.*/\1/p' <<<"$failed")
    echo "$0: the proxy could not open the demo's node ports 30080, 30081 and 30053/udp on 127.0.0.1: ${busy:-one of them} is held by another program (another 'make run' or 'make demo'?). Its log:" >&2
    grep -v 'via=' "$log" | tail -5 >&2
  elif [ -n "$failed" ]; then
    echo "$0: the proxy could not serve the demo's node ports 30080, 30081 and 30053/udp on 127.0.0.1. Its log:" >&2
    grep -v 'via=' "$log" | tail -5 >&2
  else
    echo "$0: the proxy did not serve the demo's node ports 30080, 30081 and 30053/udp on 127.0.0.1 within 10 seconds. Its log:" >&2
    tail -5 "$log" >&2
  fi
  exit 1
}

# proxy_serves WHAT: whether the proxy's log says it serves WHAT
# ("/healthz", "/metrics") rather than that it cannot (another program
# holds the port); waits, bounded, for it to say either. Prints the line.
proxy_serves() {
  local said=
  for _ in $(seq 1 30); do
    said=$(grep -E "\"(Cannot serve|Serving) $1" "$(proxy_log)" | tail -1 || true)
    [ -n "$said" ] && break
    sleep 0.1
  done
  echo "$said"
  [[ $said == *"\"Serving $1"* ]]
}

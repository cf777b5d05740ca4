#!/usr/bin/env bash
# Several edge_vision nodes behind nginx, sharing one Redis, all on this machine: the
# multi-node setup of docs/cluster.md, runnable with one command.
#
#   deploy/local/run-cluster.sh [NODES] [-- extra 'edge-vision serve' arguments]
#
#   deploy/local/run-cluster.sh                 # 2 nodes, http://127.0.0.1:8080
#   deploy/local/run-cluster.sh 3 -- --set engine.onnxruntime.threads=1
#
# Environment (defaults in brackets):
#   EV_PORT            nginx listens on 127.0.0.1:EV_PORT                          [8080]
#   EV_NODE_PORT       first node's port; node i listens on EV_NODE_PORT+i-1       [8081]
#   EV_REDIS_PORT      redis-server port                                          [6390]
#   EV_DIR             working folder: rendered nginx config, logs, pid files [mktemp -d]
#   PYTHON             the Python that has edge-vision installed                  [python3]
#
# Open http://127.0.0.1:EV_PORT/ for the overlay page; GET /api/nodes and /api/sessions
# answer from any node with the whole cluster. Ctrl-C (or SIGTERM) stops nginx, then the
# nodes (gracefully: clients get 1001 + a resume token), then Redis.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
nodes="${1:-2}"
if [ "$#" -gt 0 ]; then shift; fi
if [ "${1:-}" = "--" ]; then shift; fi
extra=("$@")

port="${EV_PORT:-8080}"
node_port="${EV_NODE_PORT:-8081}"
redis_port="${EV_REDIS_PORT:-6390}"
dir="${EV_DIR:-$(mktemp -d -t edge-vision-cluster.XXXXXX)}"
python="${PYTHON:-python3}"
nginx_bin="$(command -v nginx || echo /usr/sbin/nginx)"

mkdir -p "$dir/tmp"
nginx_pid=""
redis_pid=""
node_pids=()

stopping=""
stop_all() {
  trap - INT TERM HUP EXIT
  stopping=1
  echo "== stopping (logs in $dir)"
  # nginx first (no new clients), then the nodes (graceful: they hand their sessions over
  # and remove their keys, so Redis must still be up), then Redis.
  if [ -n "$nginx_pid" ]; then kill -QUIT "$nginx_pid" 2>/dev/null || true; fi
  for pid in ${node_pids[@]+"${node_pids[@]}"}; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in ${node_pids[@]+"${node_pids[@]}"}; do wait "$pid" 2>/dev/null || true; done
  if [ -n "$nginx_pid" ]; then wait "$nginx_pid" 2>/dev/null || true; fi
  if [ -n "$redis_pid" ]; then
    kill -TERM "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
  fi
  echo "== stopped"
}
trap stop_all INT TERM HUP EXIT

# Every process runs in a session of its own (setsid): Ctrl-C in a terminal signals the
# whole foreground process group, and a node signalled twice (Ctrl-C, then stop_all)
# would cut its graceful shutdown short. Here only stop_all signals them, once each, in
# order: nginx, the nodes (while Redis is still up), Redis.
echo "== redis-server on 127.0.0.1:$redis_port"
setsid redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
  --dir "$dir" --logfile "$dir/redis.log" &
redis_pid=$!
echo "$redis_pid" > "$dir/redis.pid"

upstreams=""
for i in $(seq 1 "$nodes"); do
  p=$((node_port + i - 1))
  echo "== node-$i on 127.0.0.1:$p (log: $dir/node-$i.log)"
  (cd "$repo" && exec setsid "$python" -m edge_vision serve --host 127.0.0.1 --port "$p" \
    --set "state.redis_url=redis://127.0.0.1:$redis_port/0" \
    --set "state.node_id=node-$i" \
    --set "state.advertise_url=http://127.0.0.1:$p" \
    ${extra[@]+"${extra[@]}"}) > "$dir/node-$i.log" 2>&1 &
  node_pids+=("$!")
  echo "$!" > "$dir/node-$i.pid"
  upstreams+="server 127.0.0.1:$p max_fails=1 fail_timeout=5s; "
done

echo "== waiting for the nodes to warm up"
for i in $(seq 1 "$nodes"); do
  p=$((node_port + i - 1))
  "$python" - "$p" "${node_pids[$((i - 1))]}" <<'PY'
import os, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(f"node on port {port} exited; see its log")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.2)
sys.exit(f"node on port {port} not ready after 300 s")
PY
done

sed -e "s|@LISTEN@|127.0.0.1:$port|" -e "s|@UPSTREAM_SERVERS@|$upstreams|" \
  "$repo/deploy/nginx/edge-vision.conf.template" > "$dir/edge-vision.conf"
cp "$repo/deploy/nginx/edge-vision-locations.conf" "$repo/deploy/nginx/nginx-local.conf" "$dir/"
mv "$dir/nginx-local.conf" "$dir/nginx.conf"
globals="daemon off;"
# As root, nginx's workers would otherwise run as 'nobody', who cannot enter $dir.
if [ "$(id -u)" -eq 0 ]; then globals="$globals user root;"; fi

echo "== nginx on http://127.0.0.1:$port/ ($nodes nodes; Ctrl-C stops everything)"
setsid "$nginx_bin" -p "$dir/" -c nginx.conf -e error.log -g "$globals" &
nginx_pid=$!
# Runs until Ctrl-C, or until any one of the processes exits on its own.
wait -n "$nginx_pid" "$redis_pid" "${node_pids[@]}" || true
if [ -z "$stopping" ]; then
  echo "== a process exited on its own; stopping the rest"
  stop_all
fi

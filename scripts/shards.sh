#!/usr/bin/env bash
# scripts/shards.sh: where does one hot limiter's Redis work go, unsharded
# and with `shards: N`, on a real Redis Cluster?
#
# Starts a 3-primary Redis Cluster (no replicas) on loopback and one
# `tollgate serve` on it with two rules for the same hot descriptor: one
# unsharded, one with `shards: $SHARDS`. For each, with coalescing off and
# on (under the limit) and with the over-limit cache off and on (at it), `tollgate bench` drives one key for SECS seconds, and
# the script reports decisions/s, the EVALSHA calls each primary ran
# (INFO commandstats) and the CPU each primary spent (/proc/<pid>/stat).
# The busiest primary's share is what sets a hot limiter's ceiling: one
# primary runs on one core.
#
# Rows "under the limit" use a limit that is never reached; rows "at 2x"
# use a per-second limit of half the decisions/s measured under the limit,
# so half the demand is refused (there the cache answers full shards).
#
# Usage: scripts/shards.sh    (builds --release unless BENCH_BIN is set)
# Knobs: SECS=5 WARMUP=1 C=16 CONNS=4 SHARDS=8 BENCH_BIN=path
# Loopback only; every process is killed on exit; each step is bounded.

set -euo pipefail

SECS=${SECS:-5}
WARMUP=${WARMUP:-1}
C=${C:-16}
CONNS=${CONNS:-4}
SHARDS=${SHARDS:-8}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
for tool in redis-server redis-cli timeout python3; do
    command -v "$tool" >/dev/null || { echo "shards.sh: $tool is not on PATH" >&2; exit 1; }
done
# shellcheck source=lib.sh
source "$ROOT/scripts/lib.sh"
tollgate_bin

# --- cluster -----------------------------------------------------------------
# A cluster node also listens on its port + 10000, so its port must be at
# most 55535.
cluster_port() {
    local port
    port=$(free_port)
    while ((port > 55535)); do port=$(free_port); done
    echo "$port"
}
PORTS=()
REDIS_PIDS=()
for i in 0 1 2; do
    port=$(cluster_port)
    mkdir -p "$WORK/n$port"
    (cd "$WORK/n$port" && exec redis-server --bind 127.0.0.1 --port "$port" --save '' \
        --appendonly no --cluster-enabled yes --cluster-config-file nodes.conf \
        --logfile redis.log) &
    PIDS+=($!)
    REDIS_PIDS+=($!)
    PORTS+=("$port")
done
for port in "${PORTS[@]}"; do
    wait_for 10 redis-cli -p "$port" ping || {
        echo "shards.sh: redis on $port did not start:" >&2
        cat "$WORK/n$port/redis.log" >&2 || true
        exit 1
    }
done
# The usual even split of the 16,384 slots.
bounds=(0 5461 10923 16384)
for i in 0 1 2; do
    python3 -c "print(' '.join(str(s) for s in range(${bounds[$i]}, ${bounds[$((i + 1))]})))" |
        xargs redis-cli -p "${PORTS[$i]}" CLUSTER ADDSLOTS >/dev/null
done
for port in "${PORTS[@]:1}"; do
    redis-cli -p "${PORTS[0]}" CLUSTER MEET 127.0.0.1 "$port" >/dev/null
done
wait_for 20 bash -c "redis-cli -p ${PORTS[0]} CLUSTER INFO | grep -q 'cluster_state:ok'" || {
    echo "shards.sh: the cluster did not form" >&2
    exit 1
}
sleep 1

# --- tollgate ----------------------------------------------------------------
mkdir "$WORK/rules"
write_rules() {
    local limit=$1
    cat >"$WORK/rules/hot.yaml" <<EOF
domain: hot
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: $limit, algorithm: fixed_window}
  - key: sharded
    rate_limit: {unit: second, requests_per_unit: $limit, algorithm: fixed_window, shards: $SHARDS}
EOF
}
STORE="redis-cluster://127.0.0.1:${PORTS[0]}?node=127.0.0.1:${PORTS[1]}&node=127.0.0.1:${PORTS[2]}"
TG_PID=
start_tollgate() {
    if [[ -n $TG_PID ]]; then
        kill "$TG_PID" 2>/dev/null || true
        wait "$TG_PID" 2>/dev/null || true
    fi
    GRPC_PORT=$(free_port)
    local http_port
    http_port=$(free_port)
    env RUST_LOG=warn "$@" "$BIN" serve --rules "$WORK/rules" --store "$STORE" \
        --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$http_port" \
        >"$WORK/tollgate.log" 2>&1 &
    PIDS+=($!)
    TG_PID=$!
    local deadline=$((SECONDS + 30))
    until "$BIN" check --addr "127.0.0.1:$GRPC_PORT" --domain hot --descriptor plain=probe \
        --timeout-ms 500 2>/dev/null | grep -q '^overall:'; do
        if ! kill -0 "$TG_PID" 2>/dev/null || ((SECONDS >= deadline)); then
            echo "shards.sh: tollgate did not start answering:" >&2
            cat "$WORK/tollgate.log" >&2
            exit 1
        fi
        sleep 0.2
    done
}

evalsha_calls() {
    redis-cli -p "$1" INFO commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p' | tr -d '\r' | grep . || echo 0
}

# measure LABEL KEY: one bench run on KEY=tenant; prints a table row.
measure() {
    local label=$1 key=$2 before=() cpu0=() out
    for i in 0 1 2; do
        before+=("$(evalsha_calls "${PORTS[$i]}")")
        cpu0+=("$(cpu_ticks "${REDIS_PIDS[$i]}")")
    done
    out=$(timeout $((SECS + WARMUP + 60)) "$BIN" bench --addr "127.0.0.1:$GRPC_PORT" --domain hot \
        --descriptor "$key=tenant" --keys 1 --concurrency "$C" --connections "$CONNS" \
        --duration "$SECS" --warmup "$WARMUP" --json)
    local rate over err calls=() cpus=() total=0
    rate=$(json_num decisions_per_s <<<"$out")
    over=$(json_num over_limit <<<"$out")
    err=$(sed -n 's/.*"errors":\([0-9]*\),.*/\1/p' <<<"$out")
    for i in 0 1 2; do
        calls+=($(($(evalsha_calls "${PORTS[$i]}") - before[i])))
        cpus+=($((($(cpu_ticks "${REDIS_PIDS[$i]}") - cpu0[i]) * TICK_US / 1000)))
        total=$((total + calls[i]))
    done
    local busiest
    busiest=$(printf '%s\n' "${calls[@]}" | sort -n | tail -n 1)
    local share
    share=$(awk -v b="$busiest" -v t="$total" 'BEGIN { if (t > 0) printf "%.0f%%", 100 * b / t; else print "-" }')
    local per
    per=$(awk -v t="$total" -v r="$rate" -v s="$SECS" -v w="$WARMUP" \
        'BEGIN { d = r * (s + w); if (d > 0) printf "%.2f", t / d; else print "-" }')
    printf '| %s | %s | %.0f | %s | %s | %s / %s / %s | %s | %s / %s / %s |\n' \
        "$label" "$key" "$rate" "${over:-0}" "${err:-0}" "${calls[0]}" "${calls[1]}" "${calls[2]}" \
        "$share" "${cpus[0]}" "${cpus[1]}" "${cpus[2]}"
    LAST_RATE=$rate
    : "$per"
}

echo
echo "| run | rule | decisions/s | refused | errors | EVALSHA per primary | busiest primary's share | Redis CPU ms per primary |"
echo "|---|---|---:|---:|---:|---|---:|---|"
write_rules 1000000000
for coalesce in false true; do
    start_tollgate TOLLGATE_REDIS__COALESCE=$coalesce
    measure "under the limit, coalescing $coalesce" plain
    under=$LAST_RATE
    measure "under the limit, coalescing $coalesce" sharded
done
LIMIT=$(awk -v r="$under" 'BEGIN { l = int(r / 2); if (l < 100) l = 100; print l }')
write_rules "$LIMIT"
for cache in false true; do
    start_tollgate TOLLGATE_OVER_LIMIT_CACHE__ENABLED=$cache
    measure "at 2x ($LIMIT/s), cache $cache" plain
    measure "at 2x ($LIMIT/s), cache $cache" sharded
done

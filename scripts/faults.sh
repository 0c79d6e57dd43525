#!/usr/bin/env bash
# scripts/faults.sh: what a limit admits, second by second, while the Redis
# Cluster under it is resharded and while one of its primaries dies.
#
# A 3+3 Redis Cluster on loopback (cluster-node-timeout NODE_TIMEOUT_MS),
# one `tollgate serve` (release) on it, and `tollgate bench` driving
# USERS users in a closed loop (C callers), each user limited to LIMIT a
# second (fixed window), far more offered than the limits admit: the
# admitted rate should stay at USERS x LIMIT whatever the cluster does.
# The load runs as back-to-back one-second `tollgate bench` runs, each one
# line of the timeline: admitted (OK), refused (OVER_LIMIT) and error
# answers per second, and p99.
#
# Events on the timeline: after QUIET seconds, `redis-cli --cluster
# reshard` moves SLOTS slots from the first primary to the second (the
# keys in them move under load); QUIET seconds after it ends, the third
# primary is killed (SIGKILL) and its replica takes over; the timeline
# ends AFTER seconds later.
#
# Usage: scripts/faults.sh    (builds --release unless BENCH_BIN is set)
# Knobs: USERS=40 LIMIT=50 C=16 CONNS=4 SLOTS=3000 QUIET=6 AFTER=14
#        NODE_TIMEOUT_MS=2000 BENCH_BIN=path
#        CSV=path (the timeline: t_s,admitted_per_s,refused_per_s,
#        errors_per_s,p99_us,limit_per_s,event; t_s is when the second
#        ended, counted from the first; limit_per_s is USERS x LIMIT;
#        event names what started in that second)
# Loopback only; every process it starts is killed on exit; each step is
# bounded by `timeout`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

USERS=${USERS:-40}
LIMIT=${LIMIT:-50}
C=${C:-16}
CONNS=${CONNS:-4}
SLOTS=${SLOTS:-3000}
QUIET=${QUIET:-6}
AFTER=${AFTER:-14}
NODE_TIMEOUT_MS=${NODE_TIMEOUT_MS:-2000}
for tool in redis-server redis-cli timeout python3; do
    command -v "$tool" >/dev/null || { echo "faults.sh: $tool is not on PATH" >&2; exit 1; }
done
tollgate_bin

# --- the cluster: six nodes, three primaries with a replica each --------------
# A cluster node also listens on its port + 10000.
cluster_port() {
    python3 -c 'import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]
    if p < 55000:
        t = socket.socket()
        try:
            t.bind(("127.0.0.1", p + 10000)); print(p); break
        except OSError: pass'
}
NODES=()
for _ in 1 2 3 4 5 6; do
    port=$(cluster_port)
    mkdir -p "$WORK/redis-$port"
    (cd "$WORK/redis-$port" && exec redis-server --bind 127.0.0.1 --port "$port" --save '' \
        --appendonly no --cluster-enabled yes --cluster-config-file nodes.conf \
        --cluster-node-timeout "$NODE_TIMEOUT_MS" --cluster-replica-validity-factor 0 \
        --logfile "$WORK/redis-$port/log") &
    PIDS+=($!)
    eval "NODE_PID_$port=$!"
    NODES+=("$port")
done
for port in "${NODES[@]}"; do wait_for 10 redis-cli -p "$port" ping; done
# shellcheck disable=SC2046
timeout 60 redis-cli --cluster create $(printf '127.0.0.1:%s ' "${NODES[@]}") --cluster-replicas 1 \
    --cluster-yes >"$WORK/create.log" 2>&1
wait_for 30 bash -c "redis-cli -p ${NODES[0]} cluster info | grep -q cluster_state:ok"
# Every node must agree before the reshard starts.
wait_for 30 bash -c "timeout 10 redis-cli --cluster check 127.0.0.1:${NODES[0]} | grep -q 'All 16384 slots covered'"
PRIMARIES=()
for port in "${NODES[@]}"; do
    redis-cli -p "$port" role | head -1 | grep -q master && PRIMARIES+=("$port")
done
((${#PRIMARIES[@]} == 3)) || { echo "faults.sh: expected 3 primaries, got ${PRIMARIES[*]}" >&2; exit 1; }
URL="redis-cluster://127.0.0.1:${NODES[0]}?$(printf 'node=127.0.0.1:%s&' "${NODES[@]:1}")"
URL=${URL%&}

# --- tollgate -----------------------------------------------------------------
mkdir -p "$WORK/rules"
cat >"$WORK/rules/faults.yaml" <<EOF
domain: faults
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: $LIMIT, algorithm: fixed_window}
EOF
GRPC=$(free_port)
HTTP=$(free_port)
TOLLGATE_DEBUG_ADDR=off TOLLGATE_LOG=warn "$BIN" serve --rules "$WORK/rules" \
    --grpc-addr "127.0.0.1:$GRPC" --http-addr "127.0.0.1:$HTTP" --store "$URL" \
    >"$WORK/tollgate.log" 2>&1 &
PIDS+=($!)
wait_for 30 "$BIN" check --addr "127.0.0.1:$GRPC" --domain faults --descriptor user=probe \
    --timeout-ms 500 || { echo "faults.sh: tollgate did not start:" >&2; cat "$WORK/tollgate.log" >&2; exit 1; }

# --- the timeline ---------------------------------------------------------------
# One second of load; prints "admitted refused errors p99" per second.
second() {
    timeout 30 "$BIN" bench --addr "127.0.0.1:$GRPC" --domain faults --descriptor user=u \
        --keys "$USERS" --concurrency "$C" --connections "$CONNS" --duration 1 --warmup 0 \
        --timeout-ms 500 --json |
        awk '{
            match($0, /"duration_s":[0-9.]+/); d = substr($0, RSTART + 13, RLENGTH - 13)
            match($0, /"ok":[0-9]+/); ok = substr($0, RSTART + 5, RLENGTH - 5)
            match($0, /"over_limit":[0-9]+/); over = substr($0, RSTART + 13, RLENGTH - 13)
            match($0, /"errors":[0-9]+/); err = substr($0, RSTART + 9, RLENGTH - 9)
            match($0, /"p99":[0-9]+/); p99 = substr($0, RSTART + 6, RLENGTH - 6)
            if (d <= 0) d = 1
            printf "%.0f %.0f %.0f %d", ok / d, over / d, err / d, p99 }'
}
# Two seconds of load first, not recorded: connections and the first
# windows settle.
second >/dev/null
second >/dev/null
CSV=${CSV:-$WORK/faults.csv}
echo "t_s,admitted_per_s,refused_per_s,errors_per_s,p99_us,limit_per_s,event" >"$CSV"
START=$(date +%s.%N)
EVENT=""
tick() { # one second of the timeline, with $EVENT if one started in it
    local row t
    row=$(second)
    t=$(awk -v s="$START" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
    read -r a r e p <<<"$row"
    echo "$t,$a,$r,$e,$p,$((USERS * LIMIT)),$EVENT" >>"$CSV"
    printf '%6s s  admitted %6s/s  refused %6s/s  errors %6s/s  p99 %7s µs  %s\n' "$t" "$a" "$r" "$e" "$p" "$EVENT" >&2
    EVENT=""
}
for _ in $(seq "$QUIET"); do tick; done

from=$(redis-cli -p "${PRIMARIES[0]}" cluster myid)
to=$(redis-cli -p "${PRIMARIES[1]}" cluster myid)
timeout 120 redis-cli --cluster reshard "127.0.0.1:${PRIMARIES[0]}" --cluster-from "$from" \
    --cluster-to "$to" --cluster-slots "$SLOTS" --cluster-yes >"$WORK/reshard.log" 2>&1 &
RESHARD=$!
PIDS+=("$RESHARD")
EVENT="reshard of $SLOTS slots starts"
while kill -0 "$RESHARD" 2>/dev/null; do tick; done
wait "$RESHARD" || { echo "faults.sh: the reshard failed:" >&2; tail -5 "$WORK/reshard.log" >&2; exit 1; }
EVENT="reshard done"
for _ in $(seq "$QUIET"); do tick; done

victim=${PRIMARIES[2]}
pid_var=NODE_PID_$victim
kill -9 "${!pid_var}"
EVENT="primary killed"
for _ in $(seq "$AFTER"); do tick; done

echo "expected admitted: $((USERS * LIMIT))/s (USERS=$USERS x LIMIT=$LIMIT); timeline in $CSV" >&2

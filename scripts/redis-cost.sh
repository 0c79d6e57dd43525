#!/usr/bin/env bash
# scripts/redis-cost.sh: how many instructions does redis-server run per
# decision tollgate asks of it? A count, not a time: unlike CPU seconds on a
# shared machine, it does not move with the machine's load, so two builds
# (or two settings) compare exactly, and a small change in the Lua scripts
# shows.
#
# redis-server runs under valgrind's callgrind (about 50 times slower than
# natively, so Redis is the bottleneck and script calls queue: batches are
# bigger than in a native run at the same concurrency). For each server
# (BENCH_BIN, and each COMPARE entry) and each algorithm, against the same
# redis-server: the counters are zeroed (`callgrind_control -z`), `tollgate
# bench` makes N decisions (C callers, KEYS keys, 1-second windows, limits
# never reached, so every key starts a new window about every call), the
# counters are dumped and read. Columns: Redis instructions per decision
# (user space; the kernel's socket work is not counted), EVALSHA commands
# per decision (INFO commandstats), and Redis system calls per decision
# (reads and writes) from the same INFO.
#
# Usage: scripts/redis-cost.sh     (builds --release unless BENCH_BIN is set)
# Knobs: N=3000 decisions per row, C=16, KEYS=10000,
#   ALGOS="fixed_window sliding_window_counter sliding_window_log token_bucket",
#   BENCH_BIN=path, COMPARE="label=path[@VAR=value,...] ..." and
#   SERVE_ENV="VAR=value ..." (the "new" server only) as in bench.sh.
# Needs valgrind (callgrind_control), redis-server, redis-cli. Loopback
# only; every process is killed on exit; each step is bounded.

set -euo pipefail

N=${N:-3000}
C=${C:-16}
KEYS=${KEYS:-10000}
LIMIT=1000000000

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
for tool in valgrind callgrind_control redis-server redis-cli timeout python3; do
    command -v "$tool" >/dev/null || { echo "redis-cost.sh: $tool is not on PATH" >&2; exit 1; }
done
# shellcheck source=lib.sh
source "$ROOT/scripts/lib.sh"
# shellcheck disable=SC2206
MEASURED=(${ALGOS:-${ALGORITHMS[*]}})
tollgate_bin

REDIS_PORT=$(free_port)
valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out" \
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
    --logfile "$WORK/redis.log" >"$WORK/valgrind.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
wait_for 60 redis-cli -p "$REDIS_PORT" ping || {
    echo "redis-cost.sh: redis-server under valgrind did not start:" >&2
    cat "$WORK/valgrind.log" >&2
    exit 1
}

mkdir "$WORK/rules"
algorithm_rules cost "$LIMIT" >"$WORK/rules/cost.yaml"

# Starts `tollgate serve` from binary $1 with the environment in the other
# arguments; sets GRPC_PORT and TOLLGATE_PID.
start_tollgate() {
    local bin=$1
    shift
    GRPC_PORT=$(free_port)
    local http_port
    http_port=$(free_port)
    env RUST_LOG=warn TOLLGATE_MAX_LOG_LIMIT=$LIMIT TOLLGATE_DEBUG_ADDR=off "$@" "$bin" serve \
        --rules "$WORK/rules" --store "redis://127.0.0.1:$REDIS_PORT" \
        --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$http_port" \
        >"$WORK/tollgate-$GRPC_PORT.log" 2>&1 &
    TOLLGATE_PID=$!
    PIDS+=("$TOLLGATE_PID")
    wait_for 60 "$bin" check --addr "127.0.0.1:$GRPC_PORT" --domain cost \
        --descriptor algo=fixed_window,user=probe --timeout-ms 5000 || {
        echo "redis-cost.sh: tollgate ($bin) did not start answering:" >&2
        cat "$WORK/tollgate-$GRPC_PORT.log" >&2
        exit 1
    }
}

# Total instructions in the latest callgrind dump.
instructions() {
    local f
    f=$(ls -t "$WORK"/callgrind.out* | head -1)
    awk '/^(summary|totals):/ { print $2; exit }' "$f"
}
# An `INFO` field (e.g. total_reads_processed), or a command's calls.
info_field() { redis-cli -p "$REDIS_PORT" info all | tr -d '\r' | sed -n "s/^$1:\([0-9]*\).*/\1/p"; }
evalsha_calls() {
    redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' |
        sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\).*/\1/p' | awk '{ print $1 + 0 } END { if (NR == 0) print 0 }'
}

compare_servers
LABELS=("${CMP_LABELS[@]}" new)
BINS=("${CMP_BINS[@]}" "$BIN")
SERVE_VARS=${SERVE_ENV:-}
ENVS=("${CMP_VARS[@]}" "${SERVE_VARS// /,}")

printf '%-10s %-24s %14s %12s %12s\n' server algorithm "instr/dec" "EVALSHA/dec" "rd+wr/dec"
for a in "${MEASURED[@]}"; do
    for i in "${!LABELS[@]}"; do
        IFS=',' read -r -a vars <<<"${ENVS[$i]}"
        start_tollgate "${BINS[$i]}" "${vars[@]}"
        # Warm up: scripts loaded, connections open.
        timeout 300 "${BINS[$i]}" bench --addr "127.0.0.1:$GRPC_PORT" --domain cost \
            --descriptor "algo=$a,user=w" --keys 100 --concurrency "$C" --requests 200 \
            --warmup 0 --timeout-ms 10000 --json >/dev/null
        e0=$(evalsha_calls)
        r0=$(info_field total_reads_processed)
        w0=$(info_field total_writes_processed)
        callgrind_control -z "$REDIS_PID" >/dev/null 2>&1
        out=$(timeout 900 "${BINS[$i]}" bench --addr "127.0.0.1:$GRPC_PORT" --domain cost \
            --descriptor "algo=$a,user=u" --keys "$KEYS" --concurrency "$C" --requests "$N" \
            --warmup 0 --timeout-ms 10000 --json)
        callgrind_control -d "$REDIS_PID" >/dev/null 2>&1
        sleep 0.5
        e1=$(evalsha_calls)
        r1=$(info_field total_reads_processed)
        w1=$(info_field total_writes_processed)
        errors=$(json_num errors <<<"$out")
        if [[ ${errors:-0} != 0 ]]; then
            echo "redis-cost.sh: ${LABELS[$i]} $a: $errors errors" >&2
        fi
        python3 -c "
n = $N
print('%-10s %-24s %14.0f %12.2f %12.2f' % ('${LABELS[$i]}', '$a', $(instructions) / n,
      ($e1 - $e0) / n, ($r1 - $r0 + $w1 - $w0) / n))"
        kill "$TOLLGATE_PID"
        wait "$TOLLGATE_PID" 2>/dev/null || true
    done
done

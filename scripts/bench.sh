#!/usr/bin/env bash
# scripts/bench.sh: how much does tollgate add on top of the Redis script it
# runs for each decision?
#
# For each algorithm (fixed_window, sliding_window_counter,
# sliding_window_log) it measures, against the same private redis-server:
#   - tollgate: `tollgate bench` (closed loop, C callers) against a
#     `tollgate serve --store redis://...`: gRPC decode, rule matching, one
#     EVALSHA of lua/<algorithm>.lua, gRPC encode. Column "tollgate dec/s"
#     (decisions per second) and tollgate's p50/p99 latency in microseconds.
#   - redis-benchmark: the same script, called directly with EVALSHA by C
#     clients, with the same ARGV (limit, window_micros, hits, negative).
#     Column "redis calls/s" and its p50/p99. This is the ceiling: tollgate
#     cannot decide faster than Redis runs the script.
# "ratio" is tollgate dec/s / redis calls/s: 1.00 would mean tollgate costs
# nothing on top of Redis. Everything (generator, tollgate, Redis) shares
# this machine's cores, so read the ratio as "where the time goes here",
# not as a capacity figure for a real deployment. Every limit is huge, so
# nothing is refused: the "refused/errors" column must read 0/0, or the
# numbers measure something else.
#
# Usage: scripts/bench.sh            (from anywhere; builds --release)
# Knobs (environment):
#   SECS=5       measured seconds per tollgate run (plus WARMUP=1)
#   C=16         concurrent callers (tollgate bench) / clients (redis-benchmark)
#   CONNS=4      HTTP/2 connections of tollgate bench
#   KEYS=1       distinct keys: 1 is one hot key; above 1 tollgate cycles
#                user=u-0..u-(KEYS-1) and redis-benchmark uses -r KEYS
#                (it draws each key placeholder independently, so the log's
#                two keys come from different pairs: same cost per call)
#   RB_N=200000  calls per redis-benchmark run
#   BENCH_BIN=path  use this binary and skip the build
#   BENCH_STORE=memory  serve from the embedded store instead (a smoke test of
#                this script; the comparison then means little)
# Needs redis-server, redis-cli and redis-benchmark on PATH. Loopback only;
# every process it starts is killed on exit, each step is bounded by
# `timeout`.

set -euo pipefail

SECS=${SECS:-5}
WARMUP=${WARMUP:-1}
C=${C:-16}
CONNS=${CONNS:-4}
KEYS=${KEYS:-1}
RB_N=${RB_N:-200000}
ALGORITHMS=(fixed_window sliding_window_counter sliding_window_log)
LIMIT=1000000000     # requests per second: never reached
WINDOW_MICROS=1000000

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

for tool in redis-server redis-cli redis-benchmark timeout; do
    command -v "$tool" >/dev/null || { echo "bench.sh: $tool is not on PATH" >&2; exit 1; }
done

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
    if command -v python3 >/dev/null; then
        python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
    else
        local p
        while :; do
            p=$((20000 + RANDOM % 20000))
            (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
        done
    fi
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

# --- build -------------------------------------------------------------------
if [[ -n ${BENCH_BIN:-} ]]; then
    BIN=$BENCH_BIN
else
    echo "building tollgate (release)..." >&2
    timeout 1800 cargo build --release --quiet
    BIN=$ROOT/target/release/tollgate
fi

# --- redis -------------------------------------------------------------------
REDIS_PORT=$(free_port)
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
    --protected-mode yes --logfile "$WORK/redis.log" &
PIDS+=($!)
wait_for 10 redis-cli -p "$REDIS_PORT" ping || {
    echo "bench.sh: redis-server did not start:" >&2
    cat "$WORK/redis.log" >&2
    exit 1
}

# --- tollgate ----------------------------------------------------------------
# One rule per algorithm, each under its own `algo` value; `user` varies with
# KEYS (tollgate bench suffixes the last entry of the template).
mkdir "$WORK/rules"
{
    echo "domain: bench"
    echo "descriptors:"
    for a in "${ALGORITHMS[@]}"; do
        echo "  - key: algo"
        echo "    value: $a"
        echo "    descriptors:"
        echo "      - key: user"
        echo "        rate_limit: {unit: second, requests_per_unit: $LIMIT, algorithm: $a}"
    done
} >"$WORK/rules/bench.yaml"

GRPC_PORT=$(free_port)
HTTP_PORT=$(free_port)
STORE=${BENCH_STORE:-redis://127.0.0.1:$REDIS_PORT}
RUST_LOG=${RUST_LOG:-warn} "$BIN" serve --rules "$WORK/rules" --store "$STORE" \
    --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$HTTP_PORT" \
    >"$WORK/tollgate.log" 2>&1 &
PIDS+=($!)
TOLLGATE_PID=$!
# tollgate reads TOLLGATE_* from its environment; this script sets none.
answers() {
    "$BIN" check --addr "127.0.0.1:$GRPC_PORT" --domain bench \
        --descriptor algo=fixed_window,user=probe --timeout-ms 500 2>/dev/null | grep -q '^overall: OK'
}
deadline=$((SECONDS + 20))
until answers; do
    if ! kill -0 "$TOLLGATE_PID" 2>/dev/null || ((SECONDS >= deadline)); then
        echo "bench.sh: tollgate did not start answering:" >&2
        cat "$WORK/tollgate.log" >&2
        exit 1
    fi
    sleep 0.1
done

# --- measure -----------------------------------------------------------------
json_num() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }

ROWS=()
for a in "${ALGORITHMS[@]}"; do
    echo "measuring $a..." >&2
    tg=$(timeout $((SECS + WARMUP + 30)) "$BIN" bench --addr "127.0.0.1:$GRPC_PORT" \
        --domain bench --descriptor "algo=$a,user=u" --keys "$KEYS" \
        --concurrency "$C" --connections "$CONNS" --duration "$SECS" --warmup "$WARMUP" --json)
    tg_rate=$(json_num decisions_per_s <<<"$tg")
    tg_p50=$(json_num p50 <<<"$tg")
    tg_p99=$(json_num p99 <<<"$tg")
    tg_over=$(json_num over_limit <<<"$tg")
    tg_err=$(sed -n 's/.*"errors":\([0-9]*\),.*/\1/p' <<<"$tg")

    sha=$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$(cat "lua/$a.lua")")
    if ((KEYS > 1)); then
        rand=(-r "$KEYS")
        k='{__rand_int__}'
    else
        rand=()
        k='{hot}'
    fi
    if [[ $a == sliding_window_log ]]; then
        keys=(2 "rb:$a:$k:log" "rb:$a:$k:meta")
    else
        keys=(1 "rb:$a:$k")
    fi
    rb=$(timeout 120 redis-benchmark -p "$REDIS_PORT" -c "$C" -n "$RB_N" "${rand[@]}" --csv \
        EVALSHA "$sha" "${keys[@]}" "$LIMIT" "$WINDOW_MICROS" 1 0 | tail -n 1)
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95...","p99_latency_ms","max..."
    IFS=, read -r _ rb_rate _ _ rb_p50 _ rb_p99 _ <<<"${rb//\"/}"

    ROWS+=("$(awk -v a="$a" -v t="$tg_rate" -v r="$rb_rate" -v tp50="$tg_p50" -v tp99="$tg_p99" \
        -v rp50="$rb_p50" -v rp99="$rb_p99" -v over="$tg_over" -v err="$tg_err" 'BEGIN {
            printf "%-24s %14.0f %14.0f %6.2f %9d %9d %9d %9d %14s\n",
                a, t, r, (r > 0 ? t / r : 0), tp50, tp99, rp50 * 1000, rp99 * 1000, over "/" err
        }')")
done

echo
echo "C=$C KEYS=$KEYS CONNS=$CONNS SECS=$SECS RB_N=$RB_N ($(nproc 2>/dev/null || echo '?') cores, all shared)"
printf "%-24s %14s %14s %6s %9s %9s %9s %9s %14s\n" algorithm "tollgate dec/s" "redis calls/s" ratio \
    "tg p50us" "tg p99us" "rb p50us" "rb p99us" "refused/errors"
printf '%s\n' "${ROWS[@]}"

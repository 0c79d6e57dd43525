#!/usr/bin/env bash
# scripts/observe-cost.sh: what do metrics and tracing cost in decisions per
# second?
#
# Starts one private redis-server and two `tollgate serve` on it, identical
# but for observability:
#   off: metrics.enabled=false, no OTLP endpoint (nothing recorded but the
#        per-rule counters, which are always kept);
#   on:  /metrics served, store calls timed, and an OTLP endpoint set with
#        otel.sampling_ratio=0 (a span is started and dropped per request;
#        the endpoint is a closed local port, so the periodic metric push
#        fails quietly, as with a collector that is down).
# Then runs `tollgate bench` against them in turns (off, on, off, on...)
# ROUNDS times, so both see the same machine noise, and prints the median
# decisions/s of each and the loss of "on" against "off".
#
# Usage: scripts/observe-cost.sh         (builds --release unless BENCH_BIN)
# Knobs: ROUNDS=5 SECS=4 WARMUP=1 C=16 CONNS=4 KEYS=1000
#        ALGORITHM=sliding_window_counter BENCH_BIN=path
#        BENCH_STORE=memory (the embedded store: no Redis in the loop, so
#        tollgate's own work, observability included, is all there is)
# Needs redis-server and redis-cli on PATH (unless BENCH_STORE=memory).
# Loopback only; every process it starts is killed on exit.

set -euo pipefail

ROUNDS=${ROUNDS:-5}
SECS=${SECS:-4}
WARMUP=${WARMUP:-1}
C=${C:-16}
CONNS=${CONNS:-4}
KEYS=${KEYS:-1000}
ALGORITHM=${ALGORITHM:-sliding_window_counter}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# shellcheck source=lib.sh
source "$ROOT/scripts/lib.sh"


tollgate_bin

if [[ ${BENCH_STORE:-} == memory ]]; then
    STORE=memory
else
    REDIS_PORT=$(free_port)
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
        --logfile "$WORK/redis.log" &
    PIDS+=($!)
    for _ in $(seq 100); do
        redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
    STORE=redis://127.0.0.1:$REDIS_PORT
fi

mkdir "$WORK/rules"
cat >"$WORK/rules/bench.yaml" <<YAML
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: $ALGORITHM}
YAML

# Starts a server with extra environment "$@"; sets PORT to its gRPC port.
# (Not in a subshell: its pid must reach PIDS for the cleanup.)
start() {
    local grpc http
    grpc=$(free_port)
    http=$(free_port)
    env RUST_LOG=warn "$@" "$BIN" serve --rules "$WORK/rules" --store "$STORE" \
        --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" \
        >>"$WORK/tollgate.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 200); do
        if "$BIN" check --addr "127.0.0.1:$grpc" --domain bench --descriptor user=probe \
            --timeout-ms 500 2>/dev/null | grep -q '^overall: OK'; then
            PORT=$grpc
            return
        fi
        sleep 0.1
    done
    echo "observe-cost.sh: tollgate did not start:" >&2
    cat "$WORK/tollgate.log" >&2
    exit 1
}

start TOLLGATE_METRICS__ENABLED=false
OFF=$PORT
start TOLLGATE_METRICS__ENABLED=true \
    TOLLGATE_OTEL__ENDPOINT="http://127.0.0.1:$(free_port)" TOLLGATE_OTEL__SAMPLING_RATIO=0
ON=$PORT

rate() {
    timeout $((SECS + WARMUP + 30)) "$BIN" bench --addr "127.0.0.1:$1" --domain bench \
        --descriptor user=u --keys "$KEYS" --concurrency "$C" --connections "$CONNS" \
        --duration "$SECS" --warmup "$WARMUP" --json |
        sed -n 's/.*"decisions_per_s":\([0-9.]*\).*/\1/p'
}

off_rates=()
on_rates=()
ratios=()
for r in $(seq "$ROUNDS"); do
    # Alternate which goes first, so neither always meets the same moment.
    if ((r % 2)); then
        off_rates+=("$(rate "$OFF")")
        on_rates+=("$(rate "$ON")")
    else
        on_rates+=("$(rate "$ON")")
        off_rates+=("$(rate "$OFF")")
    fi
    ratios+=("$(awk -v a="${on_rates[-1]}" -v b="${off_rates[-1]}" 'BEGIN { print (b > 0 ? a / b : 0) }')")
    echo "round $r: off ${off_rates[-1]} dec/s, on ${on_rates[-1]} dec/s, on/off ${ratios[-1]}" >&2
done

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
m_off=$(median "${off_rates[@]}")
m_on=$(median "${on_rates[@]}")
m_ratio=$(median "${ratios[@]}")
echo
echo "store=${STORE%%:*} algorithm=$ALGORITHM C=$C CONNS=$CONNS KEYS=$KEYS SECS=$SECS ROUNDS=$ROUNDS ($(nproc) cores, shared)"
awk -v off="$m_off" -v on="$m_on" -v ratio="$m_ratio" 'BEGIN {
    printf "observability off: %.0f dec/s (median)\nobservability on:  %.0f dec/s (median)\n", off, on
    printf "loss: %.1f%% (median of the rounds on/off ratios)\n", (1 - ratio) * 100
}'

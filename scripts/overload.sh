#!/usr/bin/env bash
# scripts/overload.sh: does tollgate stay correct and fast when callers
# outnumber what the machine can serve?
#
# Against one private redis-server, with tollgate's default settings, it
# sweeps closed-loop concurrency (tollgate bench, 10,000 keys, one
# sliding_window_counter rule that never refuses), finds the concurrency
# where decisions/s peak, then runs 4x that concurrency. Pass: 0 errors at
# every step and decisions/s at 4x within 10% of the peak. With BUSY=1 a
# busy loop holds one core for the whole run (the "busy machine" case).
#
# Usage: scripts/overload.sh          (from anywhere; builds --release)
# Knobs (environment):
#   SECS=5           measured seconds per step (plus 1 s warm-up)
#   SWEEP="4 8 16 32 64"  concurrencies of the sweep
#   KEYS=10000       distinct keys
#   BUSY=0           1: hold one core busy throughout
#   TIMEOUT_MS=      set redis.command_timeout_ms (default: tollgate's own)
#   BENCH_BIN=path   use this binary and skip the build
# Loopback only; every process it starts is killed on exit.

set -euo pipefail

SECS=${SECS:-5}
SWEEP=${SWEEP:-"4 8 16 32 64"}
KEYS=${KEYS:-10000}
BUSY=${BUSY:-0}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

for tool in redis-server redis-cli timeout python3; do
    command -v "$tool" >/dev/null || { echo "overload.sh: $tool is not on PATH" >&2; exit 1; }
done

# shellcheck source=lib.sh
source "$ROOT/scripts/lib.sh"


tollgate_bin

REDIS_PORT=$(free_port)
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
    --logfile "$WORK/redis.log" &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

mkdir "$WORK/rules"
cat >"$WORK/rules/load.yaml" <<'EOF'
domain: load
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: sliding_window_counter}
EOF

GRPC_PORT=$(free_port)
env_timeout=()
[[ -n ${TIMEOUT_MS:-} ]] && env_timeout=(TOLLGATE_REDIS__COMMAND_TIMEOUT_MS="$TIMEOUT_MS")
env ${env_timeout[@]+"${env_timeout[@]}"} RUST_LOG=warn "$BIN" serve --rules "$WORK/rules" \
    --store "redis://127.0.0.1:$REDIS_PORT" \
    --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$(free_port)" \
    >"$WORK/tollgate.log" 2>&1 &
PIDS+=($!)
TOLLGATE_PID=$!
REDIS_PID=${PIDS[0]}
for _ in $(seq 200); do
    "$BIN" check --addr "127.0.0.1:$GRPC_PORT" --domain load --descriptor user=probe \
        --timeout-ms 500 2>/dev/null | grep -q '^overall: OK' && break
    sleep 0.1
done

if [[ $BUSY == 1 ]]; then
    (while :; do :; done) &
    PIDS+=($!)
fi


run() {
    local c=$1
    local out tg0 rd0 tg1 rd1
    tg0=$(cpu_ticks "$TOLLGATE_PID")
    rd0=$(cpu_ticks "$REDIS_PID")
    out=$(timeout $((SECS + 40)) "$BIN" bench --addr "127.0.0.1:$GRPC_PORT" --domain load \
        --descriptor user=u --keys "$KEYS" --concurrency "$c" --duration "$SECS" --warmup 1 --json)
    tg1=$(cpu_ticks "$TOLLGATE_PID")
    rd1=$(cpu_ticks "$REDIS_PID")
    local rate p50 p99 max err
    rate=$(json_num decisions_per_s <<<"$out")
    p50=$(json_num p50 <<<"$out")
    p99=$(json_num p99 <<<"$out")
    max=$(json_num max <<<"$out")
    err=$(sed -n 's/.*"errors":\([0-9]*\),.*/\1/p' <<<"$out")
    # Decisions in the whole run (1 s warm-up included), estimated from the
    # measured rate: CPU is read around the whole run.
    awk -v c="$c" -v r="$rate" -v p50="$p50" -v p99="$p99" -v max="$max" -v e="$err" \
        -v tg=$((tg1 - tg0)) -v rd=$((rd1 - rd0)) -v tick="$TICK_US" -v secs="$SECS" 'BEGIN {
        n = r * (secs + 1)
        printf "%6d %12.0f %9s %9s %9s %7s %8.1f %8.1f\n", c, r, p50, p99, max, e,
            (n > 0 ? tg * tick / n : 0), (n > 0 ? rd * tick / n : 0)
    }'
}

echo "KEYS=$KEYS SECS=$SECS BUSY=$BUSY TIMEOUT_MS=${TIMEOUT_MS:-default} ($(nproc) cores, shared by generator, tollgate and Redis)"
printf "%6s %12s %9s %9s %9s %7s %8s %8s\n" callers "decisions/s" "p50 us" "p99 us" "max us" errors \
    "tg us/d" "redis us/d"
peak_rate=0
peak_c=0
total_errors=0
for c in $SWEEP; do
    row=$(run "$c")
    echo "$row"
    rate=$(awk '{print $2}' <<<"$row")
    total_errors=$((total_errors + $(awk '{print $6}' <<<"$row")))
    if awk -v r="$rate" -v p="$peak_rate" 'BEGIN{exit !(r > p)}'; then
        peak_rate=$rate
        peak_c=$c
    fi
done
over=$((peak_c * 4))
row=$(run "$over")
echo "$row"
rate=$(awk '{print $2}' <<<"$row")
total_errors=$((total_errors + $(awk '{print $6}' <<<"$row")))
awk -v r="$rate" -v p="$peak_rate" -v c="$peak_c" -v o="$over" -v e="$total_errors" 'BEGIN {
    printf "peak %.0f decisions/s at %d callers; at %d callers (4x): %.0f = %.2f of the peak; errors in all steps: %d\n",
        p, c, o, r, r / p, e
    exit !(r >= 0.9 * p && e == 0)
}' && echo "PASS" || { echo "FAIL"; exit 1; }

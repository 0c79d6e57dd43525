#!/usr/bin/env bash
# scripts/refused.sh: what `count_refused: false` costs, on admitted and on
# refused requests.
#
# One redis-server and one `tollgate serve` on it, with the same rules in
# two domains: `counted` (the default: a refused request charges the broad
# limit, as the reference does) and `free` (the broad limit says
# `count_refused: false`: what a refused request charged it is taken
# back). Each request carries the broad descriptor `site=<algorithm>`
# (a limit never reached) and a granular one, `user=u-<i>`: user u-0 is
# never limited, user u-1 is over its own limit (1 an hour; after its
# first refusal the over-limit cache refuses it without a store call).
# "0%" sends u-0 only; "50%" sends u-0 and u-1 in turn (`tollgate bench
# --keys 2`), so half the requests are refused.
#
# Per row: decisions/s and p50 latency from `tollgate bench` (closed loop,
# C callers), the share refused, script calls per decision (EVALSHA calls
# counted by Redis' INFO commandstats, over decisions), and µs of CPU per
# decision of tollgate and of redis-server (/proc/<pid>/stat). Three server
# configurations: "plain" (redis.batch_max=1 and coalescing off: every
# script call is one EVALSHA, so the calls column counts store calls
# exactly), "no cache" (plain, and the over-limit cache off: u-1's
# refusals are store calls made at the same time as the site's charge, so
# the site is charged and then taken back: the undo's own cost) and
# "defaults" (batching and coalescing on: EVALSHA commands, several calls
# each when they queue).
#
# Usage: scripts/refused.sh    (builds --release unless BENCH_BIN is set)
# Knobs: SECS=5 WARMUP=1 C=16 CONNS=4 ALGOS="fixed_window ..." BENCH_BIN=path
# Loopback only; every process is killed on exit; each step is bounded.

set -euo pipefail

SECS=${SECS:-5}
WARMUP=${WARMUP:-1}
C=${C:-16}
CONNS=${CONNS:-4}
LIMIT=1000000000

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
for tool in redis-server redis-cli timeout python3; do
    command -v "$tool" >/dev/null || { echo "refused.sh: $tool is not on PATH" >&2; exit 1; }
done
# shellcheck source=lib.sh
source "$ROOT/scripts/lib.sh"
# shellcheck disable=SC2206
MEASURED=(${ALGOS:-${ALGORITHMS[*]}})
tollgate_bin

# --- redis -------------------------------------------------------------------
start_redis

# --- rules -------------------------------------------------------------------
mkdir "$WORK/rules"
for domain in counted free; do
    count_refused=true
    [[ $domain == free ]] && count_refused=false
    {
        echo "domain: $domain"
        echo "descriptors:"
        for a in "${ALGORITHMS[@]}"; do
            echo "  - key: site"
            echo "    value: $a"
            echo "    rate_limit: {unit: second, requests_per_unit: $LIMIT, algorithm: $a, count_refused: $count_refused}"
        done
        echo "  - key: user"
        echo "    value: u-0"
        echo "    rate_limit: {unit: second, requests_per_unit: $LIMIT, algorithm: fixed_window}"
        echo "  - key: user"
        echo "    value: u-1"
        echo "    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: fixed_window}"
    } >"$WORK/rules/$domain.yaml"
done

TG_PID=
start_tollgate() {
    if [[ -n $TG_PID ]]; then
        kill "$TG_PID" 2>/dev/null || true
        wait "$TG_PID" 2>/dev/null || true
    fi
    GRPC_PORT=$(free_port)
    local http_port
    http_port=$(free_port)
    # The log's huge limit needs max_log_limit raised to it.
    env RUST_LOG=warn TOLLGATE_MAX_LOG_LIMIT=$LIMIT TOLLGATE_DEBUG_ADDR=off "$@" "$BIN" serve \
        --rules "$WORK/rules" --store "redis://127.0.0.1:$REDIS_PORT" \
        --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$http_port" \
        >"$WORK/tollgate.log" 2>&1 &
    PIDS+=($!)
    TG_PID=$!
    local deadline=$((SECONDS + 30))
    until "$BIN" check --addr "127.0.0.1:$GRPC_PORT" --domain counted --descriptor user=u-0 \
        --timeout-ms 500 2>/dev/null | grep -q '^overall: OK'; do
        if ! kill -0 "$TG_PID" 2>/dev/null || ((SECONDS >= deadline)); then
            echo "refused.sh: tollgate did not start answering:" >&2
            cat "$WORK/tollgate.log" >&2
            exit 1
        fi
        sleep 0.2
    done
}

evalsha_calls() {
    redis-cli -p "$REDIS_PORT" INFO commandstats |
        sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p' | tr -d '\r' | grep . || echo 0
}

# measure CONFIG ALGORITHM DOMAIN SHARE: one bench run; prints a table row.
measure() {
    local config=$1 a=$2 domain=$3 share=$4 user keys out
    if [[ $share == 0% ]]; then
        user=user=u-0 keys=1
    else
        user=user=u keys=2
    fi
    local calls0 tg0 rd0
    calls0=$(evalsha_calls)
    tg0=$(cpu_ticks "$TG_PID")
    rd0=$(cpu_ticks "$REDIS_PID")
    out=$(timeout $((SECS + WARMUP + 60)) "$BIN" bench --addr "127.0.0.1:$GRPC_PORT" \
        --domain "$domain" --descriptor "site=$a" --descriptor "$user" --keys "$keys" \
        --concurrency "$C" --connections "$CONNS" --duration "$SECS" --warmup "$WARMUP" --json)
    local calls tg rd rate p50 over err
    calls=$(($(evalsha_calls) - calls0))
    tg=$(($(cpu_ticks "$TG_PID") - tg0))
    rd=$(($(cpu_ticks "$REDIS_PID") - rd0))
    rate=$(json_num decisions_per_s <<<"$out")
    p50=$(json_num p50 <<<"$out")
    over=$(json_num over_limit <<<"$out")
    err=$(sed -n 's/.*"errors":\([0-9]*\),.*/\1/p' <<<"$out")
    # Counters are read around the whole run, warm-up included: decisions
    # over the same span from the measured rate.
    awk -v c="$config" -v a="$a" -v d="$domain" -v s="$share" -v r="$rate" -v p="$p50" \
        -v over="${over:-0}" -v err="${err:-0}" -v calls="$calls" -v tg="$tg" -v rd="$rd" \
        -v tick="$TICK_US" -v span=$((SECS + WARMUP)) -v secs="$SECS" 'BEGIN {
            n = r * span
            refused = (r > 0 ? over / (r * secs) : 0)
            printf "| %s | %s | %s | %s | %.0f | %d | %.0f%% | %s | %.2f | %.1f | %.1f |\n",
                c, a, d, s, r, p, 100 * refused, err, (n > 0 ? calls / n : 0),
                (n > 0 ? tg * tick / n : 0), (n > 0 ? rd * tick / n : 0)
        }'
}

echo
echo "C=$C CONNS=$CONNS SECS=$SECS ($(nproc 2>/dev/null || echo '?') cores, shared by generator, tollgate and Redis)"
echo
echo "| config | algorithm | domain | refused asked | decisions/s | p50 µs | refused | errors | EVALSHA per decision | tollgate µs CPU per decision | Redis µs CPU per decision |"
echo "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
for config in plain "no cache" defaults; do
    case $config in
        plain) start_tollgate TOLLGATE_REDIS__BATCH_MAX=1 TOLLGATE_REDIS__COALESCE=false ;;
        "no cache") start_tollgate TOLLGATE_REDIS__BATCH_MAX=1 TOLLGATE_REDIS__COALESCE=false \
            TOLLGATE_OVER_LIMIT_CACHE__ENABLED=false ;;
        *) start_tollgate ;;
    esac
    for a in "${MEASURED[@]}"; do
        for share in 0% 50%; do
            for domain in counted free; do
                measure "$config" "$a" "$domain" "$share"
            done
        done
    done
done

#!/usr/bin/env bash
# scripts/bench.sh: how much does tollgate add on top of the Redis script it
# runs for each decision?
#
# For each algorithm (fixed_window, sliding_window_counter,
# sliding_window_log, token_bucket) it measures, against the same private redis-server:
#   - tollgate: `tollgate bench` (closed loop, C callers) against a
#     `tollgate serve --store redis://...`: gRPC decode, rule matching, one
#     EVALSHA of lua/<algorithm>.lua, gRPC encode. Column "tollgate dec/s"
#     (decisions per second) and tollgate's p50/p99 latency in microseconds.
#   - redis-benchmark: the same script, called directly with EVALSHA by C
#     clients, with the same ARGV (limit, window_micros, hits, negative;
#     and the burst, the limit, for token_bucket).
#     Column "redis calls/s" and its p50/p99. This is the ceiling: tollgate
#     cannot decide faster than Redis runs the script.
# "ratio" is tollgate dec/s / redis calls/s: 1.00 would mean tollgate costs
# nothing on top of Redis. The CPU columns read user+system time of the
# tollgate and redis-server processes from /proc/<pid>/stat around each run
# (and the load generator's from bash's `time`) and divide it by the
# decisions (or calls) made in it. Everything (generator, tollgate, Redis)
# shares this machine's cores, so read the ratio as "where the time goes here",
# not as a capacity figure for a real deployment. Every limit is huge, so
# nothing is refused: the "refused/errors" column must read 0/0, or the
# numbers measure something else.
#
# Usage: scripts/bench.sh            (from anywhere; builds --release)
# Knobs (environment):
#   SECS=5       measured seconds per tollgate run (plus WARMUP=1)
#   STEADY=1     run the warm-up as a load of its own before the CPU is
#                read, so the figures are of the steady state only (by
#                default CPU is read around warm-up and measurement:
#                what starting cold costs is in the figures)
#   C=16         concurrent callers (tollgate bench) / clients (redis-benchmark)
#   CONNS=4      HTTP/2 connections of tollgate bench
#   KEYS=1       distinct keys: 1 is one hot key; above 1 tollgate cycles
#                user=u-0..u-(KEYS-1) and redis-benchmark uses -r KEYS
#                (it draws each key placeholder independently, so the log's
#                two keys come from different pairs: same cost per call)
#   RB_N=200000  calls per redis-benchmark run
#   ALGOS="fixed_window ..."  measure only these algorithms
#   BENCH_BIN=path  use this binary and skip the build
#   COMPARE="label=path[@VAR=value,...] ..."  also serve from these binaries
#                (e.g. a build of an older commit), each with the given
#                environment, and measure each right before BENCH_BIN for
#                every algorithm, against the same Redis: one row per label,
#                then "new". Only ratios from one run compare.
#   SERVE_ENV="VAR=value ..."  environment of the "new" server only (e.g.
#                TOKIO_WORKER_THREADS=1 TOLLGATE_REDIS__POOL_SIZE=1)
#                A server given TOLLGATE_STORE=memory runs on the embedded
#                store: the same binary as "embedded@TOLLGATE_STORE=memory"
#                shows what the Redis round trip costs, side by side.
#   LISTS=1      after each algorithm's row, a row "<algorithm> x2": the same
#                algorithm on a descriptor with two limits (`rate_limits:`,
#                a second and an hour, both never reached), decided in
#                one script call: what the second limit costs (its rb
#                columns stay 0: redis-benchmark has no such script)
#   LEASED=1     after the fixed window's and the token bucket's rows, a
#                row "<algorithm> leased": the same rule with `lease: true`
#                (decided from quota leased from Redis; its rb columns
#                stay 0); LEASED=only measures just the LEASE_UNIT rows
#                and the leased ones (no plain-second or no_rule rows)
#   DEFAULT=1    a row "default" after the algorithms' rows: a rule that
#                names no algorithm and no `lease`, LEASE_UNIT long (what a
#                rule gets by default: a sliding window counter, leased),
#                from every server, the null service and limitador's
#                engine too (its own fixed window); DEFAULT=only measures
#                just that row (and redis-benchmark on the algorithms)
#   LEASE_UNIT=minute  the leased row's window (default second); another
#                unit adds a row "fixed_window/<unit>" without leases
#                right before it, so the two compare on one window
#   ZIPF=1.1     draw keys from a Zipf distribution of this exponent over
#                KEYS keys (tollgate bench --zipf) instead of cycling
#                through them (redis-benchmark still draws uniformly)
#   LIMITADOR="redis cached"  also serve from limitador's engine (the
#                `limitador` library, scripts/limitador-rls, built here
#                unless LIMITADOR_BIN names it; apt-get install
#                librocksdb-dev libclang-dev first), one row per mode, labelled
#                limitador / lim-cached, against the same Redis: `redis`
#                counts every decision in Redis, `cached` counts locally
#                and flushes later (it can pass a limit). Its one limit is
#                a fixed window per `user` of LEASE_UNIT's length (or a
#                second); it is measured on the fixed window's rows, not
#                on the leased ones.
#   NULL=1       also serve the null service (examples/null_rls.rs, built
#                here unless NULL_BIN names it: a bare gRPC server answering
#                OK, no decision), labelled null and measured where
#                limitador is: the most any service answers this load tool
#                on this machine
#   BENCH_STORE=memory  serve from the embedded store instead (a smoke test of
#                this script; the comparison then means little)
#   CSV=path     also append one line per row to this CSV file (its
#                header first when the file is empty): label,row,concurrency,
#                keys,decisions_per_s,p50_us,p99_us,service_cpu_us,
#                redis_cpu_us,generator_cpu_us,redis_calls_per_decision,
#                over_limit,errors,rb_calls_per_s,rb_cpu_us (CPU in µs per
#                decision, as in the printed table); scripts/bench-all
#                draws its plots from these
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
# Seconds of the strace run per row (0: no system-call columns).
SYSCALL_SECS=${SYSCALL_SECS:-2}
LIMIT=1000000000     # requests per second: never reached
WINDOW_MICROS=1000000

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

for tool in redis-server redis-cli redis-benchmark timeout python3; do
    command -v "$tool" >/dev/null || { echo "bench.sh: $tool is not on PATH" >&2; exit 1; }
done

# shellcheck source=lib.sh
source "$ROOT/scripts/lib.sh"
# shellcheck disable=SC2206
MEASURED=(${ALGOS:-${ALGORITHMS[*]}})



# --- build -------------------------------------------------------------------
tollgate_bin

# --- redis -------------------------------------------------------------------
start_redis

# --- tollgate ----------------------------------------------------------------
# One rule per algorithm, each under its own `algo` value; `user` varies with
# KEYS (tollgate bench suffixes the last entry of the template).
mkdir "$WORK/rules"
algorithm_rules bench "$LIMIT" >"$WORK/rules/bench.yaml"
# The fixed window and the token bucket decided from leased quota
# (LEASED=1), and the same without leases.
LEASE_UNIT=${LEASE_UNIT:-second}
for a in fixed_window token_bucket; do
    cat >>"$WORK/rules/bench.yaml" <<EOF
  - key: algo
    value: ${a}_leased
    descriptors:
      - key: user
        rate_limit: {unit: $LEASE_UNIT, requests_per_unit: $LIMIT, algorithm: $a, lease: true}
  - key: algo
    value: ${a}_$LEASE_UNIT
    descriptors:
      - key: user
        rate_limit: {unit: $LEASE_UNIT, requests_per_unit: $LIMIT, algorithm: $a}
EOF
done
# What a rule gets by default (DEFAULT=1): `algo=default`.
cat >>"$WORK/rules/bench.yaml" <<EOF
  - key: algo
    value: default
    descriptors:
      - key: user
        rate_limit: {unit: $LEASE_UNIT, requests_per_unit: $LIMIT}
EOF
ZIPF_ARGS=()
[[ -n ${ZIPF:-} ]] && ZIPF_ARGS=(--zipf "$ZIPF")
# Two limits on one descriptor per algorithm (LISTS=1): `algo=<a>_x2`.
for a in "${ALGORITHMS[@]}"; do
    cat >>"$WORK/rules/bench.yaml" <<EOF
  - key: algo
    value: ${a}_x2
    descriptors:
      - key: user
        rate_limits:
          - {unit: second, requests_per_unit: $LIMIT, algorithm: $a}
          - {unit: hour, requests_per_unit: $LIMIT, algorithm: $a}
EOF
done

STORE=${BENCH_STORE:-redis://127.0.0.1:$REDIS_PORT}
# Starts one `tollgate serve` from binary $1, with the environment
# variables in the remaining arguments, and waits until it answers; sets
# GRPC_PORT and TOLLGATE_PID.
start_tollgate() {
    local bin=$1 log
    shift
    GRPC_PORT=$(free_port)
    local http_port
    http_port=$(free_port)
    log="$WORK/tollgate-$GRPC_PORT.log"
    # A server's own TOLLGATE_STORE=... (in COMPARE) picks its store.
    local store=$STORE arg
    for arg in "$@"; do
        case $arg in TOLLGATE_STORE=*) store=${arg#TOLLGATE_STORE=} ;; esac
    done
    # The log rule's huge limit needs max_log_limit raised to it; no debug
    # listener (its default port is fixed, and servers run side by side),
    # when the binary has one (older builds in COMPARE do not, and refuse
    # a setting they do not know).
    local debug=()
    if grep -qa debug_show_values "$bin"; then
        debug=(TOLLGATE_DEBUG_ADDR=off)
    fi
    env RUST_LOG="${RUST_LOG:-warn}" TOLLGATE_MAX_LOG_LIMIT=$LIMIT "${debug[@]}" "$@" "$bin" serve --rules "$WORK/rules" --store "$store" \
        --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$http_port" \
        >"$log" 2>&1 &
    PIDS+=($!)
    TOLLGATE_PID=$!
    local deadline=$((SECONDS + 20))
    until "$bin" check --addr "127.0.0.1:$GRPC_PORT" --domain bench \
        --descriptor algo=fixed_window,user=probe --timeout-ms 500 2>/dev/null | grep -q '^overall: OK'; do
        if ! kill -0 "$TOLLGATE_PID" 2>/dev/null || ((SECONDS >= deadline)); then
            echo "bench.sh: tollgate ($bin) did not start answering:" >&2
            cat "$log" >&2
            exit 1
        fi
        sleep 0.1
    done
}

# The servers compared, by label: those of COMPARE, then "new" ($BIN).
LABELS=()
BINS=()
PORTS=()
TG_PIDS=()
compare_servers
for i in "${!CMP_LABELS[@]}"; do
    IFS=, read -r -a vars <<<"${CMP_VARS[$i]}"
    start_tollgate "${CMP_BINS[$i]}" "${vars[@]}"
    LABELS+=("${CMP_LABELS[$i]}") BINS+=("${CMP_BINS[$i]}") PORTS+=("$GRPC_PORT") TG_PIDS+=("$TOLLGATE_PID")
done
# Waits until the server $1 (pid) on port $2 answers a decision; else
# prints its log ($4) under its name ($3) and stops the script.
await_answers() {
    local pid=$1 port=$2 name=$3 log=$4
    local deadline=$((SECONDS + 20))
    until "$BIN" check --addr "127.0.0.1:$port" --domain bench \
        --descriptor user=probe --timeout-ms 500 2>/dev/null | grep -q '^overall: OK'; do
        if ! kill -0 "$pid" 2>/dev/null || ((SECONDS >= deadline)); then
            echo "bench.sh: $name did not start answering:" >&2
            cat "$log" >&2
            exit 1
        fi
        sleep 0.1
    done
}
# limitador's engine (LIMITADOR), started like tollgate and answering the
# same `tollgate bench` load; its CPU is its process's.
if [[ -n ${LIMITADOR:-} ]]; then
    if [[ -z ${LIMITADOR_BIN:-} ]]; then
        echo "building limitador-rls (release)..." >&2
        [[ -f scripts/limitador-rls/Cargo.lock ]] || cp Cargo.lock scripts/limitador-rls/Cargo.lock
        # The library needs its disk_storage feature to compile (RocksDB):
        # Debian's librocksdb-dev and libclang-dev spare building RocksDB.
        lib=/usr/lib/$(uname -m)-linux-gnu
        [[ -e $lib/librocksdb.so ]] && export ROCKSDB_LIB_DIR=$lib SNAPPY_LIB_DIR=$lib
        CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target} timeout 1800 cargo build --release --quiet \
            --manifest-path scripts/limitador-rls/Cargo.toml
        LIMITADOR_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/limitador-rls
    fi
    case ${LEASE_UNIT:-second} in
        second) lim_secs=1 ;; minute) lim_secs=60 ;; hour) lim_secs=3600 ;; day) lim_secs=86400 ;;
        *) echo "bench.sh: LIMITADOR: no window for LEASE_UNIT=$LEASE_UNIT" >&2; exit 1 ;;
    esac
    for mode in $LIMITADOR; do
        port=$(free_port)
        "$LIMITADOR_BIN" "127.0.0.1:$port" "redis://127.0.0.1:$REDIS_PORT" "$lim_secs" "$mode" \
            >"$WORK/limitador-$mode.log" 2>&1 &
        PIDS+=($!)
        pid=$!
        await_answers "$pid" "$port" "limitador-rls ($mode)" "$WORK/limitador-$mode.log"
        label=limitador
        [[ $mode == cached ]] && label=lim-cached
        LABELS+=("$label") BINS+=("$BIN") PORTS+=("$port") TG_PIDS+=("$pid")
    done
fi
# The null service (NULL=1): the ceiling of this load on this machine.
if [[ ${NULL:-0} == 1 ]]; then
    if [[ -z ${NULL_BIN:-} ]]; then
        cargo build --release --quiet --example null_rls
        NULL_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/null_rls
    fi
    port=$(free_port)
    "$NULL_BIN" "127.0.0.1:$port" >"$WORK/null.log" 2>&1 &
    PIDS+=($!)
    pid=$!
    await_answers "$pid" "$port" "the null service" "$WORK/null.log"
    LABELS+=(null) BINS+=("$BIN") PORTS+=("$port") TG_PIDS+=("$pid")
fi
# shellcheck disable=SC2086
start_tollgate "$BIN" ${SERVE_ENV:-}
LABELS+=(new) BINS+=("$BIN") PORTS+=("$GRPC_PORT") TG_PIDS+=("$TOLLGATE_PID")

# --- measure -----------------------------------------------------------------
# User + system CPU of a process so far, in clock ticks.

# System calls per decision, from `strace -c` attached for SYSCALL_SECS
# to a process, during a second, shorter run of the same load (strace
# slows what it traces, so the CPU columns come from the first run):
# prints "reads writes futex" per decision.
syscalls_per_decision() {
    local pid=$1 out=$2 decisions=$3
    awk -v n="$decisions" '
        $NF ~ /^(read|readv|recvfrom|recvmsg)$/ { r += $4 }
        $NF ~ /^(write|writev|sendto|sendmsg)$/ { w += $4 }
        $NF == "futex" { f += $4 }
        END { if (n > 0) printf "%.2f %.2f %.2f", r / n, w / n, f / n; else print "0 0 0" }' "$out"
}

# measure_tollgate INDEX ROW-NAME DESCRIPTOR: one closed-loop run of
# `tollgate bench` against server INDEX (CPU of tollgate, Redis and the
# generator read around it), then, with strace, a short run for the
# system-call columns; appends a row to ROWS. Reads rb_* of the
# algorithm's redis-benchmark run.
measure_tollgate() {
    local i=$1 a=$2 desc=$3 tg tg0 tg1 rd0 rd1 gen_cpu tg_rate tg_p50 tg_p99 tg_over tg_err
    echo "measuring $a with tollgate (${LABELS[$i]})..." >&2
    local warm=$WARMUP
    if [[ ${STEADY:-0} == 1 ]]; then
        timeout $((WARMUP + 30)) "${BINS[$i]}" bench \
            --addr "127.0.0.1:${PORTS[$i]}" --domain bench --descriptor "$desc" \
            --keys "$KEYS" "${ZIPF_ARGS[@]}" --concurrency "$C" --connections "$CONNS" --duration "$WARMUP" \
            --warmup 0 --json >/dev/null
        warm=0
    fi
    tg0=$(cpu_ticks "${TG_PIDS[$i]}")
    rd0=$(cpu_ticks "$REDIS_PID")
    sc0=$(script_calls "$REDIS_PORT")
    # bash's `time` gives the load generator's own CPU (user, system).
    tg=$({ TIMEFORMAT='%U %S'; time timeout $((SECS + warm + 30)) "${BINS[$i]}" bench \
        --addr "127.0.0.1:${PORTS[$i]}" --domain bench --descriptor "$desc" \
        --keys "$KEYS" "${ZIPF_ARGS[@]}" --concurrency "$C" --connections "$CONNS" --duration "$SECS" \
        --warmup "$warm" --json; } 2>"$WORK/gen-time")
    gen_cpu=$(awk 'END { print $1 + $2 }' "$WORK/gen-time")
    tg1=$(cpu_ticks "${TG_PIDS[$i]}")
    rd1=$(cpu_ticks "$REDIS_PID")
    sc1=$(script_calls "$REDIS_PORT")
    tg_rate=$(json_num decisions_per_s <<<"$tg")
    tg_p50=$(json_num p50 <<<"$tg")
    tg_p99=$(json_num p99 <<<"$tg")
    tg_over=$(json_num over_limit <<<"$tg")
    tg_err=$(sed -n 's/.*"errors":\([0-9]*\),.*/\1/p' <<<"$tg")
    local sys_tg="- - -" sys_rd="- - -"
    if ((SYSCALL_SECS > 0)); then
        timeout $((SYSCALL_SECS + 20)) strace -c -f -p "${TG_PIDS[$i]}" -o "$WORK/strace-tg" 2>/dev/null &
        local st_tg=$!
        timeout $((SYSCALL_SECS + 20)) strace -c -f -p "$REDIS_PID" -o "$WORK/strace-rd" 2>/dev/null &
        local st_rd=$!
        sleep 0.5
        local short n
        short=$(timeout $((SYSCALL_SECS + 30)) "${BINS[$i]}" bench \
            --addr "127.0.0.1:${PORTS[$i]}" --domain bench --descriptor "$desc" \
            --keys "$KEYS" "${ZIPF_ARGS[@]}" --concurrency "$C" --connections "$CONNS" --duration "$SYSCALL_SECS" \
            --warmup 0 --json)
        kill -INT "$st_tg" "$st_rd" 2>/dev/null || true
        wait "$st_tg" "$st_rd" 2>/dev/null || true
        # Calls made while strace was attached but outside the measured
        # seconds (the attach and detach) are few next to the run's.
        n=$(awk -v r="$(json_num decisions_per_s <<<"$short")" -v s="$SYSCALL_SECS" 'BEGIN { printf "%.0f", r * s }')
        sys_tg=$(syscalls_per_decision "${TG_PIDS[$i]}" "$WORK/strace-tg" "$n")
        sys_rd=$(syscalls_per_decision "$REDIS_PID" "$WORK/strace-rd" "$n")
    fi
    # CPU is read around the whole run, warm-up included, so the
    # decisions are estimated over the same span from the measured rate.
    ROWS+=("$(awk -v a="$a" -v l="${LABELS[$i]}" -v t="$tg_rate" -v r="$rb_rate" -v tp50="$tg_p50" -v tp99="$tg_p99" \
        -v rp50="$rb_p50" -v rp99="$rb_p99" -v over="$tg_over" -v err="$tg_err" \
        -v tgt=$((tg1 - tg0)) -v rdt=$((rd1 - rd0)) -v tick="$TICK_US" -v span=$((SECS + warm)) \
        -v rbcpu="$rb_cpu" -v gen="$gen_cpu" -v systg="$sys_tg" -v sysrd="$sys_rd" -v sc=$((sc1 - sc0)) 'BEGIN {
            n = t * span
            tgc = (n > 0 ? tgt * tick / n : 0)
            rdc = (n > 0 ? rdt * tick / n : 0)
            genc = (n > 0 ? gen * 1000000 / n : 0)
            split(systg, st, " "); split(sysrd, sr, " ")
            printf "%-23s %-6s %10.0f %10.0f %6.2f %8d %8d %8d %8d %8.1f %8.2f %7.4f %6.2f %8.1f %8.1f %9s %6s %6s %6s %6s %6s\n",
                a, l, t, r, (r > 0 ? t / r : 0), tp50, tp99, rp50 * 1000, rp99 * 1000,
                tgc, rdc, (n > 0 ? sc / n : 0), (rdc > 0 ? tgc / rdc : 0), rbcpu, genc, over "/" err,
                st[1], st[2], st[3], sr[1], sr[2]
        }')")
    # Each row as it is measured too, so a run cut short keeps what it had.
    echo "row: ${ROWS[-1]}" >&2
    if [[ -n ${CSV:-} ]]; then
        [[ -s $CSV ]] || echo "label,row,concurrency,keys,decisions_per_s,p50_us,p99_us,service_cpu_us,redis_cpu_us,generator_cpu_us,redis_calls_per_decision,over_limit,errors,rb_calls_per_s,rb_cpu_us" >"$CSV"
        awk -v a="$a" -v l="${LABELS[$i]}" -v c="$C" -v k="$KEYS" -v t="$tg_rate" -v tp50="$tg_p50" -v tp99="$tg_p99" \
            -v over="$tg_over" -v err="$tg_err" -v r="$rb_rate" -v rbcpu="$rb_cpu" -v gen="$gen_cpu" \
            -v tgt=$((tg1 - tg0)) -v rdt=$((rd1 - rd0)) -v tick="$TICK_US" -v span=$((SECS + warm)) -v sc=$((sc1 - sc0)) 'BEGIN {
                n = t * span
                printf "%s,%s,%d,%d,%.0f,%d,%d,%.2f,%.2f,%.2f,%.4f,%d,%d,%.0f,%.2f\n", l, a, c, k, t, tp50, tp99,
                    (n > 0 ? tgt * tick / n : 0), (n > 0 ? rdt * tick / n : 0), (n > 0 ? gen * 1000000 / n : 0),
                    (n > 0 ? sc / n : 0), over, err, r, rbcpu
            }' >>"$CSV"
    fi
}

ROWS=()
for a in "${MEASURED[@]}"; do
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
    # The bucket reads its burst from ARGV[5]; the others ignore it.
    burst=()
    [[ $a == token_bucket ]] && burst=("$LIMIT")
    echo "measuring $a with redis-benchmark..." >&2
    rd0=$(cpu_ticks "$REDIS_PID")
    rb=$(timeout 120 redis-benchmark -p "$REDIS_PORT" -c "$C" -n "$RB_N" "${rand[@]}" --csv \
        EVALSHA "$sha" "${keys[@]}" "$LIMIT" "$WINDOW_MICROS" 1 0 "${burst[@]}" | tail -n 1)
    rd1=$(cpu_ticks "$REDIS_PID")
    rb_cpu=$(awk -v t=$((rd1 - rd0)) -v tick="$TICK_US" -v n="$RB_N" 'BEGIN { printf "%.1f", t * tick / n }')
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95...","p99_latency_ms","max..."
    IFS=, read -r _ rb_rate _ _ rb_p50 _ rb_p99 _ <<<"${rb//\"/}"

    if [[ ${LEASED:-0} != only && ${DEFAULT:-0} != only ]]; then
        for i in "${!LABELS[@]}"; do
            measure_tollgate "$i" "$a" "algo=$a,user=u"
        done
    fi
    if [[ ${LEASED:-0} =~ ^(1|only)$ && ($a == fixed_window || $a == token_bucket) ]]; then
        saved=("$rb_rate" "$rb_p50" "$rb_p99" "$rb_cpu")
        rb_rate=0 rb_p50=0 rb_p99=0 rb_cpu=0
        if [[ $LEASE_UNIT != second ]]; then
            for i in "${!LABELS[@]}"; do
                measure_tollgate "$i" "$a/$LEASE_UNIT" "algo=${a}_$LEASE_UNIT,user=u"
            done
        fi
        for i in "${!LABELS[@]}"; do
            [[ ${LABELS[$i]} =~ ^(limitador|lim-cached|null)$ ]] && continue
            measure_tollgate "$i" "$a leased" "algo=${a}_leased,user=u"
        done
        rb_rate=${saved[0]} rb_p50=${saved[1]} rb_p99=${saved[2]} rb_cpu=${saved[3]}
    fi
    if [[ ${LISTS:-0} == 1 ]]; then
        saved=("$rb_rate" "$rb_p50" "$rb_p99" "$rb_cpu")
        rb_rate=0 rb_p50=0 rb_p99=0 rb_cpu=0
        for i in "${!LABELS[@]}"; do
            measure_tollgate "$i" "$a x2" "algo=${a}_x2,user=u"
        done
        rb_rate=${saved[0]} rb_p50=${saved[1]} rb_p99=${saved[2]} rb_cpu=${saved[3]}
    fi
done

# What a rule gets by default, from every server side by side.
if [[ ${DEFAULT:-0} =~ ^(1|only)$ ]]; then
    for i in "${!LABELS[@]}"; do
        rb_rate=0 rb_p50=0 rb_p99=0 rb_cpu=0
        measure_tollgate "$i" default "algo=default,user=u"
    done
fi

# The gRPC floor: a descriptor that matches no rule is decided without a
# store call, so this row is what tollgate costs before any store.
if [[ ${LEASED:-0} != only && ${DEFAULT:-0} != only ]]; then
    for i in "${!LABELS[@]}"; do
        rb_rate=0 rb_p50=0 rb_p99=0 rb_cpu=0
        measure_tollgate "$i" no_rule "norule=u"
    done
fi

echo
echo "C=$C KEYS=$KEYS CONNS=$CONNS SECS=$SECS RB_N=$RB_N STORE=${BENCH_STORE:-redis} ($(nproc 2>/dev/null || echo '?') cores, all shared)"
printf "%-23s %-6s %10s %10s %6s %8s %8s %8s %8s %8s %8s %7s %6s %8s %8s %9s %6s %6s %6s %6s %6s\n" algorithm bin "tg dec/s" "rb call/s" ratio \
    "tg p50" "tg p99" "rb p50" "rb p99" "tg cpu" "rd cpu" "rd/dec" "cpu x" "rb cpu" "gen cpu" "ref/err" \
    "tg rd" "tg wr" "futex" "rd rd" "rd wr"
printf '%s\n' "${ROWS[@]}"
echo "latencies in µs; cpu: µs of CPU per decision (tg: tollgate, rd: the Redis server during tollgate's run),"
echo "rd/dec: script calls (EVAL, EVALSHA) Redis ran per decision; cpu x = tg cpu / rd cpu; rb cpu: the Redis server's µs per call under redis-benchmark;"
echo "gen cpu: the load generator (tollgate bench) per decision, on the same cores;"
echo "no_rule: a descriptor that matches no rule (no store call: the gRPC floor);"
echo "system calls per decision from strace -c in a separate ${SYSCALL_SECS}s run: tg rd/wr: tollgate's socket"
echo "reads/writes (gRPC and Redis; the Redis side is about rd wr/rd rd), futex: tollgate's wake-ups"
echo "across threads; rd rd/wr: the Redis server's reads/writes, all on tollgate's connections"

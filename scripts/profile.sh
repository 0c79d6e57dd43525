#!/usr/bin/env bash
# scripts/profile.sh: where does tollgate's CPU per decision go?
#
# Serves one rule (fixed_window a second unless ALGORITHM and UNIT say
# otherwise) from a private redis-server with a release
# build, drives it with `tollgate bench` (C callers, one hot key unless KEYS says more), and
# reports, each over its own run:
#   1. CPU per decision of the tollgate process, user and system, from
#      /proc/<pid>/stat;
#   2. system calls per decision, by name (`strace -c -f`; strace slows the
#      process, the counts per decision stay meaningful);
#   3. with perf installed, a sampled profile of the process grouped by
#      component: kernel, HTTP/2 and gRPC (h2, hyper, tonic, tower), the
#      Redis client (fred), the tokio runtime, the allocator, memory copies,
#      protobuf, and tollgate's own code.
#
# Usage: scripts/profile.sh       (builds --release)
# Knobs (environment): SECS=3, C=16, CONNS=4, KEYS=1 (distinct keys, as in
# bench.sh), STORE=memory (the embedded store instead of Redis, to see
# what the round trip costs), BENCH_BIN=path (skip the build),
# SERVE_ENV="VAR=value ..." (environment of the server only, e.g.
# TOKIO_WORKER_THREADS=1), ALGORITHM=fixed_window (or default: the rule
# names none), UNIT=second, LEASE=false (or true: the rule's `lease`;
# unset, the rule names none), TOP=N (also list the N functions sampled most), CALLGRAPH=1 (record call
# stacks too, and show who calls memmove: a large future moved shows there). Needs redis-server and redis-cli; strace and perf
# steps are skipped when the tool is missing or not permitted.

set -euo pipefail

SECS=${SECS:-3}
C=${C:-16}
CONNS=${CONNS:-4}
KEYS=${KEYS:-1}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# shellcheck source=lib.sh
source "$ROOT/scripts/lib.sh"


tollgate_bin

start_redis

mkdir "$WORK/rules"
ALGORITHM=${ALGORITHM:-fixed_window}
named=", algorithm: $ALGORITHM"
[[ $ALGORITHM == default ]] && named=""
[[ -n ${LEASE:-} ]] && named+=", lease: $LEASE"
cat >"$WORK/rules/bench.yaml" <<EOF
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: ${UNIT:-second}, requests_per_unit: 1000000000$named}
EOF
GRPC_PORT=$(free_port)
HTTP_PORT=$(free_port)
# shellcheck disable=SC2086
env RUST_LOG=warn ${SERVE_ENV:-} "$BIN" serve --rules "$WORK/rules" \
    --store "${STORE:-redis://127.0.0.1:$REDIS_PORT}" \
    --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$HTTP_PORT" \
    >"$WORK/tollgate.log" 2>&1 &
PIDS+=($!)
PID=$!
for _ in $(seq 200); do
    "$BIN" check --addr "127.0.0.1:$GRPC_PORT" --domain bench --descriptor user=probe \
        --timeout-ms 500 2>/dev/null | grep -q '^overall: OK' && break
    sleep 0.1
done

# Runs the load for SECS and prints the number of calls made.
load() {
    timeout $((SECS + 30)) "$BIN" bench --addr "127.0.0.1:$GRPC_PORT" --domain bench \
        --descriptor user=u --keys "$KEYS" --concurrency "$C" --connections "$CONNS" \
        --duration "$SECS" --warmup 0 --json | sed -n 's/.*"requests":\([0-9]*\).*/\1/p'
}
ticks() { awk '{print $14, $15}' "/proc/$PID/stat"; }

load >/dev/null # warm up connections and the script cache
read -r u0 s0 < <(ticks)
n=$(load)
read -r u1 s1 < <(ticks)
awk -v n="$n" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v t="$TICK_US" -v secs="$SECS" 'BEGIN {
    printf "decisions/s %.0f; tollgate CPU per decision: %.1f µs user + %.1f µs system\n",
        n / secs, u * t / n, s * t / n
}'

if command -v strace >/dev/null; then
    strace -c -f -p "$PID" -o "$WORK/strace.txt" 2>/dev/null &
    tracer=$!
    sleep 0.5
    n=$(load)
    kill -INT "$tracer" 2>/dev/null || true
    wait "$tracer" 2>/dev/null || true
    echo
    echo "system calls per decision ($n decisions, under strace; those of 0.01 and more):"
    awk -v n="$n" '$1 ~ /^[0-9.]+$/ && $NF != "total" {
        calls = $4; total += calls
        if (calls / n >= 0.01) printf "  %-16s %6.2f\n", $NF, calls / n
    } END { printf "  %-16s %6.2f\n", "all", total / n }' "$WORK/strace.txt"
fi

if command -v perf >/dev/null && perf record -o /dev/null -- true >/dev/null 2>&1; then
    graph=()
    [[ -n ${CALLGRAPH:-} ]] && graph=(--call-graph dwarf,16384)
    perf record -F 999 "${graph[@]}" -p "$PID" -o "$WORK/perf.data" >/dev/null 2>&1 &
    recorder=$!
    sleep 0.5
    load >/dev/null
    kill -INT "$recorder" 2>/dev/null || true
    wait "$recorder" 2>/dev/null || true
    echo
    echo "share of tollgate's sampled CPU, by component:"
    perf report -i "$WORK/perf.data" --no-children --sort dso,sym --stdio 2>/dev/null |
        grep '%' | grep -v '^#' | awk '{
            pct = $1; sub(/%/, "", pct); dso = $2; $1 = ""; $2 = ""; s = $0; c = "other (std, libc, unresolved)"
            if (dso ~ /kernel/) c = "kernel (sockets, scheduler, wakeups)"
            else if (s ~ /h2::|hyper|http_body|http::|tower|tonic|axum/) c = "HTTP/2 and gRPC (h2, hyper, tonic, tower)"
            else if (s ~ /fred|redis_protocol/) c = "Redis client (fred)"
            else if (s ~ /tokio/) c = "tokio runtime"
            else if (s ~ /prost/) c = "protobuf (prost)"
            else if (s ~ /mi_|malloc|free|cfree|je_|rjem|sdallocx|mallocx/) c = "allocator"
            else if (s ~ /memmove|memcpy|memset|memcmp/) c = "memory copies"
            else if (s ~ /tollgate/) c = "tollgate itself"
            sum[c] += pct
        } END { for (c in sum) printf "  %5.1f%%  %s\n", sum[c], c }' | sort -rn
    if [[ ${TOP:-0} -gt 0 ]]; then
        echo
        echo "the $TOP functions with the most samples:"
        perf report -i "$WORK/perf.data" --no-children --sort dso,sym --stdio 2>/dev/null |
            grep '%' | grep -v '^#' | head -n "$TOP" | cut -c1-160
    fi
    if [[ -n ${CALLGRAPH:-} ]]; then
        echo
        echo "who calls memmove (memory copies), callee first:"
        perf report -i "$WORK/perf.data" --no-children -S __memmove_avx512_unaligned_erms \
            --call-graph=callee,0.2,2 --max-stack 4 --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40
    fi
fi

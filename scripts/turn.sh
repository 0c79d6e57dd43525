#!/usr/bin/env bash
# scripts/turn.sh: what a rule with a minute's window does when the minute
# turns. Starts one private redis-server and `tollgate serve` on it with
# the default rule (no algorithm, no `lease`: a sliding window counter,
# leased), runs `tollgate bench` over KEYS users for SECS seconds, and
# every SAMPLE seconds prints, since the last sample: the script calls
# Redis ran, the leases taken and the decisions answered from leases
# (from /metrics). A rule whose limiters all turn at once shows a dip in
# local decisions and a burst of script calls at each minute.
#
# Usage: scripts/turn.sh              (builds --release unless BENCH_BIN)
# Knobs: SECS=90 SAMPLE=5 C=64 CONNS=4 KEYS=100000 BENCH_BIN=path
# Needs redis-server, redis-cli and curl on PATH. Loopback only; every
# process it starts is killed on exit.

set -euo pipefail

SECS=${SECS:-90}
SAMPLE=${SAMPLE:-5}
C=${C:-64}
CONNS=${CONNS:-4}
KEYS=${KEYS:-100000}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. scripts/lib.sh
tollgate_bin
start_redis

mkdir -p "$WORK/rules"
cat >"$WORK/rules/bench.yaml" <<YAML
domain: bench
descriptors:
  - key: algo
    value: default
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1000000000}
YAML

GRPC=$(free_port)
HTTP=$(free_port)
TOLLGATE_DEBUG_ADDR=off RUST_LOG=warn "$BIN" serve --rules "$WORK/rules" \
    --store "redis://127.0.0.1:$REDIS_PORT" --grpc-addr "127.0.0.1:$GRPC" \
    --http-addr "127.0.0.1:$HTTP" >"$WORK/tollgate.log" 2>&1 &
PIDS+=($!)
wait_for 20 "$BIN" check --addr "127.0.0.1:$GRPC" --domain bench \
    --descriptor algo=default,user=probe --timeout-ms 500 || {
    echo "turn.sh: tollgate did not start:" >&2
    cat "$WORK/tollgate.log" >&2
    exit 1
}

metric() { curl -s "127.0.0.1:$HTTP/metrics" | awk -v m="$1" '$1 == m { print $2 + 0; f = 1 } END { if (!f) print 0 }'; }

timeout $((SECS + 30)) "$BIN" bench --addr "127.0.0.1:$GRPC" --domain bench \
    --descriptor algo=default,user=u --keys "$KEYS" --concurrency "$C" \
    --connections "$CONNS" --duration "$SECS" --warmup 0 --json >"$WORK/bench.json" &
BENCH=$!
PIDS+=($BENCH)

printf '%-8s %12s %12s %16s\n' "wall" "script calls" "leases" "local decisions"
calls=$(script_calls "$REDIS_PORT")
taken=$(metric tollgate_lease_taken_total)
local_=$(metric tollgate_lease_local_decisions_total)
for ((t = SAMPLE; t <= SECS; t += SAMPLE)); do
    sleep "$SAMPLE"
    c=$(script_calls "$REDIS_PORT")
    k=$(metric tollgate_lease_taken_total)
    l=$(metric tollgate_lease_local_decisions_total)
    printf '%-8s %12d %12d %16d\n' "$(date +%T)" $((c - calls)) $((k - taken)) $((l - local_))
    calls=$c taken=$k local_=$l
done
wait "$BENCH" || true
echo "bench: $(cat "$WORK/bench.json")"

#!/usr/bin/env bash
# RedisStore throughput and Redis CPU per decision, beside redis-benchmark on the same server
# and the same script.
#
#   bash scripts/redis_compare.sh [seconds]
#
# Starts a throwaway redis-server on a free port, then runs, one after the other:
#   1. redis-benchmark INCR (-P 16 -c 64): the unit of Redis CPU, from INFO commandstats;
#   2. redis-benchmark -P 16 -c 64: EVALSHA of lua/gcra.lua with one request of one key
#      (the script the store runs), a pipelined C client as the ceiling of one call per
#      request; then the same with three keys;
#   3. benches/src/bin/redis_bench.rs, 1 and 3 limits per request, 64 and 256 tasks, with
#      batching (the default) and without (--batch 1: one call per request);
#   4. redis_bench with 1 limit of each window algorithm (fixed window, sliding window,
#      sliding log), against the GCRA run;
# and prints decisions per second, latency, and Redis's time per decision: the scripts'
# (INFO commandstats) in INCR units, and the server's whole CPU (INFO cpu). Every request
# passes (quota of one token per microsecond, burst 10^9), so every decision writes its keys.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"

source scripts/throwaway_redis.sh

# BIN_DIR: a folder with a prebuilt redis_bench (e.g. copied to a machine without cargo).
if [ -n "${BIN_DIR:-}" ]; then
  bench="$BIN_DIR/redis_bench"
else
  cargo build -p tollgate-bench --release --quiet --bin redis_bench --features redis
  bench=target/release/redis_bench
fi

sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat lua/window.lua lua/gcra.lua)")
# As many requests as the store is likely to make in `seconds`, for a similar duration.
requests=$((seconds * 60000))
# The usec per call of one command in INFO commandstats since the last reset.
usec() {
  redis-cli -p "$port" info commandstats | tr -d '\r' | grep "^cmdstat_$1:" \
    | sed -E 's/.*usec_per_call=([0-9.]+).*/\1/'
}
reset() { redis-cli -p "$port" flushall >/dev/null; redis-cli -p "$port" config resetstat >/dev/null; }
reset
redis-benchmark -p "$port" -P 16 -c 64 -n "$((requests * 4))" -r 10000 -q INCR 'k:__rand_int__' >/dev/null
incr=$(usec incr)
reset
baseline=$(redis-benchmark -p "$port" -P 16 -c 64 -n "$requests" -r 10000 --csv \
  EVALSHA "$sha" 1 'bench:__rand_int__' '' 1 1 1000000000 1 1 '' | tail -1 | cut -d, -f2 | tr -d '"')
base_usec=$(usec evalsha)
reset
# The same with three keys per call: the ceiling for a request of three limits.
baseline3=$(redis-benchmark -p "$port" -P 16 -c 64 -n "$((requests / 2))" -r 10000 --csv \
  EVALSHA "$sha" 3 'bench:a:__rand_int__' 'bench:b:__rand_int__' 'bench:c:__rand_int__' '' \
  3 1 1000000000 1 1 '' 1 1000000000 1 1 '' 1 1000000000 1 1 '' | tail -1 | cut -d, -f2 | tr -d '"')
base3_usec=$(usec evalsha)
reset

run() {
  redis-cli -p "$port" flushall >/dev/null
  "$bench" --url "redis://127.0.0.1:$port/" --tasks "${3:-64}" --seconds "$seconds" --limits "$1" \
    --algorithm "${2:-gcra}" --batch "${4:-128}" | tail -1
}
field() { sed -E "s/.*$1=([0-9.]+).*/\1/" <<<"$2"; }
printf '\nINCR: %s us of Redis per call (INFO commandstats): the unit below\n' "$incr"
printf '\n%-42s %12s %8s %8s %12s %10s\n' "run" "decisions/s" "p50 us" "p99 us" "script/INCR" "cpu us"
line() {
  printf '%-42s %12s %8s %8s %12s %10s\n' "$1" "$(field decisions_per_sec "$2")" \
    "$(field p50_us "$2")" "$(field p99_us "$2")" \
    "$(python3 -c "print(f'{$(field script_us_per_decision "$2") / $incr:.1f}')")" \
    "$(field redis_cpu_us_per_decision "$2")"
}
printf '%-42s %12.0f %8s %8s %12s\n' "redis-benchmark, gcra.lua 1 key" "$baseline" - - \
  "$(python3 -c "print(f'{$base_usec / $incr:.1f}')")"
printf '%-42s %12.0f %8s %8s %12s\n' "redis-benchmark, gcra.lua 3 keys" "$baseline3" - - \
  "$(python3 -c "print(f'{$base3_usec / $incr:.1f}')")"
declare -A r
for limits in 1 3; do
  for tasks in 64 256; do
    for batch in 1 128; do
      r[$limits,$tasks,$batch]=$(run "$limits" gcra "$tasks" "$batch")
      line "RedisStore $limits limit(s), $tasks tasks, batch $batch" "${r[$limits,$tasks,$batch]}"
    done
  done
done
fixed=$(run 1 fixed-window)
line "RedisStore 1 fixed-window limit" "$fixed"
sliding=$(run 1 sliding-window)
line "RedisStore 1 sliding-window limit" "$sliding"
log=$(run 1 sliding-log)
line "RedisStore 1 sliding-log limit" "$log"

one=${r[1,64,128]}
three=${r[3,64,128]}
rate() { field decisions_per_sec "$1"; }
python3 - "$baseline" "$baseline3" "$(rate "$one")" "$(rate "$three")" \
  "$(rate "${r[1,64,1]}")" "$(rate "${r[3,64,1]}")" \
  "$(rate "$fixed")" "$(rate "$sliding")" "$(rate "$log")" <<'PY'
import sys
base, base3, one, three, one_alone, three_alone, fixed, sliding, log = (float(x) for x in sys.argv[1:])
print(f"\n1 limit, batched / one call per request:   {one / one_alone:.2f}")
print(f"3 limits, batched / one call per request:  {three / three_alone:.2f}")
print(f"1 limit / redis-benchmark 1 key:           {one / base:.2f}")
print(f"3 limits / redis-benchmark 3 keys:         {three / base3:.2f}")
print(f"fixed window / GCRA, time per decision:    {one / fixed:.2f}")
print(f"sliding window / GCRA, time per decision:  {one / sliding:.2f}")
print(f"sliding log / GCRA, time per decision:     {one / log:.2f}")
PY

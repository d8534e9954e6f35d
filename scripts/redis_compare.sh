#!/usr/bin/env bash
# RedisStore throughput beside redis-benchmark, on the same server and the same script.
#
#   bash scripts/redis_compare.sh [seconds]
#
# Starts a throwaway redis-server on a free port, then runs, one after the other:
#   1. redis-benchmark -P 16 -c 64: EVALSHA of lua/gcra.lua with one key (the same
#      single-key GCRA script the store runs), a pipelined C client as the ceiling;
#   2. bench/src/bin/redis_bench.rs with 64 tasks and 1 limit per request;
#   3. redis-benchmark again with three keys per call (the ceiling for three limits);
#   4. bench/src/bin/redis_bench.rs with 64 tasks and 3 limits per request;
#   5. bench/src/bin/redis_bench.rs with 1 limit of each window algorithm (fixed window, sliding
#      window, sliding log), against the GCRA run of step 2;
# and prints decisions per second and the ratios. Every request passes (quota of one
# token per microsecond, burst 10^9), so every decision writes its keys.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

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
baseline=$(redis-benchmark -p "$port" -P 16 -c 64 -n "$requests" -r 10000 --csv \
  EVALSHA "$sha" 1 'bench:__rand_int__' '' 1 1000000000 1 1 '' | tail -1 | cut -d, -f2 | tr -d '"')
redis-cli -p "$port" flushall >/dev/null
# The same with three keys per call: the ceiling for a request of three limits.
baseline3=$(redis-benchmark -p "$port" -P 16 -c 64 -n "$((requests / 2))" -r 10000 --csv \
  EVALSHA "$sha" 3 'bench:a:__rand_int__' 'bench:b:__rand_int__' 'bench:c:__rand_int__' '' \
  1 1000000000 1 1 '' 1 1000000000 1 1 '' 1 1000000000 1 1 '' | tail -1 | cut -d, -f2 | tr -d '"')
redis-cli -p "$port" flushall >/dev/null

run() {
  "$bench" --url "redis://127.0.0.1:$port/" --tasks 64 --seconds "$seconds" --limits "$1" \
    --algorithm "${2:-gcra}" | tail -1
}
one=$(run 1)
redis-cli -p "$port" flushall >/dev/null
three=$(run 3)
redis-cli -p "$port" flushall >/dev/null
fixed=$(run 1 fixed-window)
redis-cli -p "$port" flushall >/dev/null
sliding=$(run 1 sliding-window)
redis-cli -p "$port" flushall >/dev/null
log=$(run 1 sliding-log)

rate() { sed -E 's/.*decisions_per_sec=([0-9]+).*/\1/' <<<"$1"; }
printf '\n%-44s %12s\n' "run" "decisions/s"
printf '%-44s %12.0f\n' "redis-benchmark -P 16 -c 64, gcra.lua 1 key" "$baseline"
printf '%-44s %12.0f\n' "redis-benchmark -P 16 -c 64, gcra.lua 3 keys" "$baseline3"
printf '%-44s %12s   %s\n' "RedisStore, 64 tasks, 1 limit" "$(rate "$one")" "$one"
printf '%-44s %12s   %s\n' "RedisStore, 64 tasks, 3 limits" "$(rate "$three")" "$three"
printf '%-44s %12s\n' "RedisStore, 1 fixed-window limit" "$(rate "$fixed")"
printf '%-44s %12s\n' "RedisStore, 1 sliding-window limit" "$(rate "$sliding")"
printf '%-44s %12s\n' "RedisStore, 1 sliding-log limit" "$(rate "$log")"
python3 - "$baseline" "$baseline3" "$(rate "$one")" "$(rate "$three")" \
  "$(rate "$fixed")" "$(rate "$sliding")" "$(rate "$log")" <<'PY'
import sys
base, base3, one, three, fixed, sliding, log = (float(x) for x in sys.argv[1:])
print(f"\n1 limit / redis-benchmark 1 key:    {one / base:.2f}   (target >= 0.80)")
print(f"3 limits / redis-benchmark 3 keys:  {three / base3:.2f}   (target >= 0.90)")
print(f"3 limits / 1 limit:                 {three / one:.2f}")
print(f"GCRA / fixed window (time ratio):   {one / fixed:.2f}   (target <= 1.10)")
print(f"GCRA / sliding window (time ratio): {one / sliding:.2f}   (target <= 1.10)")
print(f"GCRA / sliding log (time ratio):    {one / log:.2f}")
PY

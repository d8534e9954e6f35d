#!/usr/bin/env bash
# Redis CPU per decision, one hot key against 10,000 keys, of two builds of redis_bench side
# by side (interleaved rounds on one throwaway redis-server): e.g. main's and this branch's,
# to see what coalescing a batch's requests of one key (src/store/redis/coalesce.rs) saves.
#
#   BEFORE=/path/to/redis_bench AFTER=/path/to/redis_bench bash scripts/redis_hotkey.sh [seconds] [rounds]
#
# (AFTER defaults to this tree's release build.) Each round runs, for each build, 256 tasks
# of one GCRA limit each on one thread (batch 128, the default), over --keys 1 and then
# --keys 10000; quotas so large every request passes. Prints per run decisions/s, the
# scripts' time per decision (INFO commandstats) and the server's whole CPU per decision
# (INFO cpu: used_cpu_sys + used_cpu_user), then the medians.
#
# REDIS_CPUS and BENCH_CPUS (taskset CPU lists) pin the server and the benchmark apart.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-3}"
rounds="${2:-3}"
before="${BEFORE:?BEFORE=path of the redis_bench to compare with}"
if [ -z "${AFTER:-}" ]; then
  cargo build -p tollgate-bench --release --quiet --bin redis_bench --features redis
  AFTER=target/release/redis_bench
fi
after="$AFTER"

source scripts/throwaway_redis.sh

field() { sed -E "s/.*$1=([0-9.]+).*/\1/" <<<"$2"; }
declare -A runs
printf '%-8s %-7s %12s %14s %12s\n' build keys decisions/s script_us/dec cpu_us/dec
for _ in $(seq "$rounds"); do
  for keys in 1 10000; do
    for build in before after; do
      bin=$before
      [ "$build" = after ] && bin=$after
      redis-cli -p "$port" flushall >/dev/null
      pin=()
      if [ -n "${BENCH_CPUS:-}" ]; then pin=(taskset -c "$BENCH_CPUS"); fi
      line=$("${pin[@]}" "$bin" --url "redis://127.0.0.1:$port/" --tasks 256 --seconds "$seconds" \
        --limits 1 --keys "$keys" | tail -1)
      d=$(field decisions_per_sec "$line")
      s=$(field script_us_per_decision "$line")
      c=$(field redis_cpu_us_per_decision "$line")
      printf '%-8s %-7s %12s %14s %12s\n' "$build" "$keys" "$d" "$s" "$c"
      runs[$build,$keys,d]+="$d " runs[$build,$keys,s]+="$s " runs[$build,$keys,c]+="$c "
    done
  done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
printf '\nmedians of %s rounds\n%-8s %-7s %12s %14s %12s\n' "$rounds" build keys decisions/s script_us/dec cpu_us/dec
for keys in 1 10000; do
  for build in before after; do
    printf '%-8s %-7s %12s %14s %12s\n' "$build" "$keys" "$(median "${runs[$build,$keys,d]}")" \
      "$(median "${runs[$build,$keys,s]}")" "$(median "${runs[$build,$keys,c]}")"
  done
done

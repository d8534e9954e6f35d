#!/usr/bin/env bash
# The many-core runs of the hot-key work (guide/hot_keys.md), in one script, each part
# pinned apart: the server (or the checking threads) on the first half of the cores, the
# load on the other half but one, Redis on the last core.
#
#   bash scripts/many_cores.sh                       # every part, default lengths
#   SECONDS_PER_CELL=0.5 ROUNDS=1 DURATION=2 bash scripts/many_cores.sh   # a quick try
#   BEFORE=/path/to/redis_bench bash scripts/many_cores.sh   # with the Redis part
#
# 1. Memory store (`scale`): the hot key and many keys, at 1, 2, 4, ... threads up to the
#    cores, tollgate, tollgate-striped (8 stripes a key) and governor, one cell after
#    the other in one process, the ratios to governor in its table. A thread count above
#    the cores given to it is not run.
# 2. Redis CPU per decision (`scripts/redis_hotkey.sh`): one hot key and 10,000 keys, this
#    build (coalescing a batch's requests of one key) against BEFORE, a redis_bench built
#    from a tree without it (e.g. `git worktree add /tmp/b <commit>` and `cargo build
#    -p tollgate-bench --release --bin redis_bench --features redis` there); Redis on its
#    own core, the benchmark on the first half. Skipped without BEFORE.
# 3. HTTP (`scripts/http_compare.sh`): plain axum, tower_governor and tollgate (allowed,
#    refused, Redis), medians of ROUNDS interleaved rounds; the server on the first half,
#    wrk on the other half but one (as many wrk threads), Redis on the last core.
#
# With fewer than 4 cores nothing can be pinned apart: the parts run unpinned, and the
# figures say nothing of many cores (the script says so). Prints the machine (lscpu's
# model name and the core count) first: put it with the tables in guide/hot_keys.md.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_CELL="${SECONDS_PER_CELL:-2}"
export ROUNDS="${ROUNDS:-3}"
export DURATION="${DURATION:-5}"

cores=$(nproc)
model=$(lscpu 2>/dev/null | sed -nE 's/^Model name:[[:space:]]+//p' | head -1)
echo "# machine: ${model:-unknown CPU}, $cores cores ($(date -u +%Y-%m-%d))"

half=$((cores / 2))
if [ "$cores" -ge 4 ]; then
  server_cpus="0-$((half - 1))"
  load_cpus="$half-$((cores - 2))"
  redis_cpus="$((cores - 1))"
  load_threads=$((cores - 1 - half))
else
  echo "# fewer than 4 cores: nothing pinned apart, these figures say nothing of many cores"
  server_cpus=""
  load_cpus=""
  redis_cpus=""
  load_threads=1
  half=$cores
fi
echo "# cpus: server/checks ${server_cpus:-any}, load ${load_cpus:-any}, redis ${redis_cpus:-any}"

pin() {
  local cpus=$1
  shift
  if [ -n "$cpus" ]; then taskset -c "$cpus" "$@"; else "$@"; fi
}

threads=""
for t in 1 2 4 8 16 32 64; do
  [ "$t" -le "$half" ] && threads="${threads:+$threads,}$t"
done
case ",$threads," in *",$half,"*) ;; *) threads="$threads,$half" ;; esac

echo
echo "## 1. memory store: threads $threads on cpus ${server_cpus:-any}"
cargo build -p tollgate-bench --release --quiet --bin scale
pin "$server_cpus" target/release/scale --threads "$threads" --seconds "$SECONDS_PER_CELL" \
  --cases hot_key,many_keys --impls tollgate,tollgate-striped,governor

echo
echo "## 2. Redis CPU per decision, one hot key and 10,000 keys"
if [ -n "${BEFORE:-}" ]; then
  cargo build -p tollgate-bench --release --quiet --bin redis_bench --features redis
  REDIS_CPUS="$redis_cpus" BENCH_CPUS="$server_cpus" AFTER=target/release/redis_bench \
    bash scripts/redis_hotkey.sh 3 "$ROUNDS"
else
  echo "skipped: BEFORE (a redis_bench built without coalescing) is not set"
fi

echo
echo "## 3. HTTP, server on cpus ${server_cpus:-any}, wrk on ${load_cpus:-any} ($load_threads threads)"
SERVER_CPUS="$server_cpus" WRK_CPUS="$load_cpus" REDIS_CPUS="$redis_cpus" \
  THREADS="$load_threads" CONNS="$((64 * load_threads))" bash scripts/http_compare.sh

#!/usr/bin/env bash
# Lease mode against one check per request, on a throwaway Redis: four instances in one
# process, 64 tasks, each scenario twice, interleaved (benches/src/bin/lease_bench.rs).
#
#   bash scripts/lease_compare.sh [seconds]
#   bash scripts/lease_compare.sh fault     # hot key over the limit, leased, 15 s; Redis
#                                           # killed (kill -9) at 5 s and restarted empty at 6 s
set -euo pipefail
cd "$(dirname "$0")/.."
mode=compare
if [ "${1:-}" = fault ]; then mode=fault; shift; fi
seconds="${1:-5}"

source scripts/throwaway_redis.sh

# BIN_DIR: a folder with a prebuilt lease_bench (e.g. copied to a machine without cargo).
if [ -n "${BIN_DIR:-}" ]; then
  bench="$BIN_DIR/lease_bench"
else
  cargo build -p tollgate-bench --release --quiet --bin lease_bench --features redis
  bench=target/release/lease_bench
fi
if [ "$mode" = compare ]; then
  "$bench" --url "redis://127.0.0.1:$port/" --tasks 64 --seconds "$seconds"
  exit
fi
"$bench" --url "redis://127.0.0.1:$port/" --tasks 64 --seconds 15 --timeline hot-over &
bench_pid=$!
sleep 5
kill -9 "$(cat "$dir/redis.pid")"
echo "--- redis-server killed at 5 s" >&2
sleep 1
start_redis
echo "--- redis-server restarted empty at 6 s" >&2
wait "$bench_pid"

#!/usr/bin/env bash
# Lease mode against one check per request, on a throwaway Redis: four instances in one
# process, 64 tasks, each scenario twice, interleaved (bench/src/bin/lease_bench.rs).
#
#   bash scripts/lease_compare.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

# BIN_DIR: a folder with a prebuilt lease_bench (e.g. copied to a machine without cargo).
if [ -n "${BIN_DIR:-}" ]; then
  bench="$BIN_DIR/lease_bench"
else
  cargo build -p tollgate-bench --release --quiet --bin lease_bench --features redis
  bench=target/release/lease_bench
fi
"$bench" --url "redis://127.0.0.1:$port/" --tasks 64 --seconds "$seconds"

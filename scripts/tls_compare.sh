#!/usr/bin/env bash
# RedisStore decisions per second over TLS against plain TCP, on loopback, in one run.
#
#   bash scripts/tls_compare.sh [seconds] [rounds]
#
# Makes a throwaway CA and a server certificate for 127.0.0.1 (openssl), starts one
# redis-server serving both its plain port and a TLS port, then runs
# benches/src/bin/redis_bench.rs (feature `redis-tls`) against each, alternating, `rounds`
# times (default 3), each round `seconds` long (default 5): 64 tasks, one GCRA limit,
# batched (the store's default), then the same with 3 limits. Prints every round and the
# medians' ratio TLS / plain. Loopback: the network costs nothing, so the difference is
# encryption and the TLS records alone, on both sides (Redis's TLS shares its core).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
rounds="${2:-3}"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
tls_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT

openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj '/CN=tollgate bench CA' \
  -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj '/CN=127.0.0.1' \
  -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\n' >"$dir/san.ext"
openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
  -CAcreateserial -days 1 -extfile "$dir/san.ext" -out "$dir/server.pem" 2>/dev/null

redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
  --tls-port "$tls_port" --tls-cert-file "$dir/server.pem" --tls-key-file "$dir/server.key" \
  --tls-ca-cert-file "$dir/ca.pem" --tls-auth-clients no
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

if [ -n "${BIN_DIR:-}" ]; then
  bench="$BIN_DIR/redis_bench"
else
  cargo build -p tollgate-bench --release --quiet --bin redis_bench --features redis-tls
  bench=target/release/redis_bench
fi

run() { # run plain|tls LIMITS
  redis-cli -p "$port" flushall >/dev/null
  local url="redis://127.0.0.1:$port/" extra=()
  if [ "$1" = tls ]; then
    url="rediss://127.0.0.1:$tls_port/"
    extra=(--ca "$dir/ca.pem" --admin-url "redis://127.0.0.1:$port/")
  fi
  "$bench" --url "$url" --tasks 64 --seconds "$seconds" --limits "$2" "${extra[@]}" | tail -1 \
    | sed -E 's/.*decisions_per_sec=([0-9.]+) p50_us=([0-9]+) p99_us=([0-9]+).*redis_cpu_us_per_decision=([0-9.]+).*/\1 \2 \3 \4/'
}

printf '%-8s %-6s %6s %12s %8s %8s %10s\n' round kind limits decisions/s p50_us p99_us redis_cpu
results=()
for limits in 1 3; do
  for round in $(seq "$rounds"); do
    for kind in plain tls; do
      read -r rate p50 p99 cpu < <(run "$kind" "$limits")
      printf '%-8s %-6s %6s %12s %8s %8s %10s\n' "$round" "$kind" "$limits" "$rate" "$p50" "$p99" "$cpu"
      results+=("$kind $limits $rate")
    done
  done
done
printf '%s\n' "${results[@]}" | python3 -c '
import sys, statistics
rates = {}
for line in sys.stdin:
    kind, limits, rate = line.split()
    rates.setdefault((kind, limits), []).append(float(rate))
for limits in ("1", "3"):
    plain = statistics.median(rates[("plain", limits)])
    tls = statistics.median(rates[("tls", limits)])
    print(f"{limits} limit(s): TLS / plain = {tls / plain:.2f} (medians {tls:.0f} / {plain:.0f} decisions/s)")
'

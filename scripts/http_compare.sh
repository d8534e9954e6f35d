#!/usr/bin/env bash
# Requests per second over HTTP with wrk: plain axum against tower_governor and tollgate.
#
#   bash scripts/http_compare.sh
#   ROUNDS=5 DURATION=5 CONNS=64 THREADS=1 bash scripts/http_compare.sh
#
# Server configs (benches/src/bin/http_bench_server.rs, `GET /` answering "hello"):
#   plain           bare axum router
#   governor        tower_governor with headers, per peer IP, nothing refused
#   tollgate-allow  tollgate, memory store, per peer IP, nothing refused
#   tollgate-deny   tollgate, memory store, one token a day: all but the first are 429s
#   tollgate-redis  tollgate on a throwaway redis-server (skipped without redis-server)
#
# In each of ROUNDS rounds (default 5) every config runs once, the order rotated by one
# each round: start the server on a free loopback port, wait for it, check one response,
# run `wrk -t$THREADS -c$CONNS -d${DURATION}s` (defaults 1, 64, 5), stop it. The table has
# the median requests/s per config over the rounds and its ratio to plain axum's median.
# wrk's Requests/sec counts every response, 429s included ("Non-2xx or 3xx responses" is
# a separate count, shown as the non-2xx share): for tollgate-deny it is all responses.
#
# On a machine with cores to spare, pin the three apart with taskset CPU lists, e.g.
#   SERVER_CPUS=0-3 WRK_CPUS=4-7 REDIS_CPUS=8 THREADS=4 CONNS=256 bash scripts/http_compare.sh
# (the server's tokio runtime starts one worker per CPU it may run on).
#
# Installs wrk (Debian package) if it is missing. Client, server (and Redis) share the
# machine's cores: compare ratios, not absolute figures, and only within one run.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${ROUNDS:-5}"
DURATION="${DURATION:-5}"
CONNS="${CONNS:-64}"
THREADS="${THREADS:-1}"
SERVER_CPUS="${SERVER_CPUS:-}"
WRK_CPUS="${WRK_CPUS:-}"
REDIS_CPUS="${REDIS_CPUS:-}"

if ! command -v wrk >/dev/null 2>&1; then
  echo "==> installing wrk (Debian package)"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends wrk >/dev/null
fi

# Replaces the current (sub)shell with "$@" on the CPUs in $1 (a taskset list), or on any
# CPU if $1 is empty: call it in a subshell or in the background, so that `$!` is the
# command's own pid.
pinned() {
  local cpus=$1
  shift
  if [ -n "$cpus" ]; then exec taskset -c "$cpus" "$@"; else exec "$@"; fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

dir=$(mktemp -d)
redis_port=""
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  if [ -n "$redis_port" ]; then redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

configs=(plain governor tollgate-allow tollgate-deny)
features=()
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
  redis_port=$(free_port)
  (pinned "$REDIS_CPUS" redis-server --port "$redis_port" --bind 127.0.0.1 --save '' \
    --appendonly no --dir "$dir" --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log")
  for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  configs+=(tollgate-redis)
  features=(--features redis)
else
  echo "redis-server or redis-cli not found: skipping tollgate-redis" >&2
fi

# BIN_DIR: a folder with a prebuilt http_bench_server (e.g. copied to a machine without
# cargo); otherwise it is built here.
if [ -n "${BIN_DIR:-}" ]; then
  server="$BIN_DIR/http_bench_server"
else
  echo "==> cargo build -p tollgate-bench --release --bin http_bench_server ${features[*]}"
  cargo build -p tollgate-bench --release --quiet --bin http_bench_server "${features[@]}"
  server=target/release/http_bench_server
fi

# Runs one config once; appends "config requests/s non2xx responses" to $dir/results.
run_one() {
  local mode=$1 port log out rps non2xx total code
  port=$(free_port)
  log="$dir/server-$mode.log"
  pinned "$SERVER_CPUS" "$server" --mode "$mode" --port "$port" --redis-url "redis://127.0.0.1:${redis_port:-6379}/" \
    >"$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 400); do
    if grep -q '^listening' "$log" 2>/dev/null; then break; fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "server $mode exited:" >&2
      cat "$log" >&2
      exit 1
    fi
    sleep 0.05
  done
  if ! grep -q '^listening' "$log"; then
    echo "server $mode did not start within 20 s:" >&2
    cat "$log" >&2
    exit 1
  fi
  # One probe: the status the config must answer (tollgate-deny's first request passes).
  code=$(python3 -c 'import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen(sys.argv[1]).status)
except urllib.error.HTTPError as e:
    print(e.code)' "http://127.0.0.1:$port/")
  [ "$code" = 200 ] || { echo "$mode: first response $code, expected 200" >&2; exit 1; }
  out=$(pinned "$WRK_CPUS" wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:$port/")
  kill "$server_pid"
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  total=$(awk '/requests in/ {print $1}' <<<"$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' <<<"$out")
  [ -n "$rps" ] && [ -n "$total" ] || { echo "$mode: no figures from wrk:" >&2; echo "$out" >&2; exit 1; }
  echo "$mode $rps ${non2xx:-0} $total" >>"$dir/results"
  printf '  %-16s %12.0f req/s  (%s of %s non-2xx)\n' "$mode" "$rps" "${non2xx:-0}" "$total"
}

n=${#configs[@]}
echo "==> $ROUNDS rounds of: ${configs[*]}; wrk -t$THREADS -c$CONNS -d${DURATION}s; $(nproc) cores"
echo "    cpus: server ${SERVER_CPUS:-any}, wrk ${WRK_CPUS:-any}, redis ${REDIS_CPUS:-any}"
for ((round = 0; round < ROUNDS; round++)); do
  echo "round $((round + 1))/$ROUNDS"
  for ((i = 0; i < n; i++)); do
    run_one "${configs[$(((i + round) % n))]}"
  done
done

if [ -n "$redis_port" ]; then
  # tollgate-redis fails closed: a request Redis did not decide is a 503. Concurrent
  # requests share script calls (RedisStore::batch), so there are fewer calls than
  # requests, but every response must be a 2xx.
  stats=$(redis-cli -p "$redis_port" info commandstats | tr -d '\r' | grep '^cmdstat_evalsha:' || true)
  calls=$(sed -nE 's/.*[:,]calls=([0-9]+).*/\1/p' <<<"$stats")
  failed=$(sed -nE 's/.*failed_calls=([0-9]+).*/\1/p' <<<"$stats")
  scripts=$((${calls:-0} - ${failed:-0}))
  responses=$(awk '$1 == "tollgate-redis" {n += $4} END {print n + 0}' "$dir/results")
  refused=$(awk '$1 == "tollgate-redis" {n += $3} END {print n + 0}' "$dir/results")
  echo "tollgate-redis: $scripts script calls run by Redis for $responses responses ($refused non-2xx)"
  if [ "$scripts" -eq 0 ] || [ "$refused" -ne 0 ]; then
    echo "FAIL: tollgate-redis requests were not all decided by Redis" >&2
    exit 1
  fi
fi

python3 - "$dir/results" "${configs[@]}" <<'PY'
import statistics, sys
path, configs = sys.argv[1], sys.argv[2:]
runs = {c: [] for c in configs}
for line in open(path):
    mode, rps, non2xx, total = line.split()
    runs[mode].append((float(rps), int(non2xx), int(total)))
base = statistics.median(r[0] for r in runs["plain"])
print(f"\n{'config':<16} {'median req/s':>13} {'ratio':>7} {'non-2xx':>8}   runs (req/s)")
for c in configs:
    rs = runs[c]
    med = statistics.median(r[0] for r in rs)
    share = sum(r[1] for r in rs) / sum(r[2] for r in rs)
    each = " ".join(f"{r[0]:.0f}" for r in rs)
    print(f"{c:<16} {med:>13.0f} {med / base:>7.3f} {share:>8.1%}   {each}")
bad = [c for c in configs if c != "tollgate-deny"
       and sum(r[1] for r in runs[c]) > 0.01 * sum(r[2] for r in runs[c])]
deny = runs.get("tollgate-deny")
if deny and sum(r[1] for r in deny) < 0.99 * sum(r[2] for r in deny):
    bad.append("tollgate-deny (too few 429s)")
if bad:
    sys.exit("FAIL: wrong statuses in " + ", ".join(bad))
PY

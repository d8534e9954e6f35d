#!/usr/bin/env bash
# A shared limit measured the way users run it (issue 31): N separate rules_server
# processes on one throwaway Redis, flooded or paced by HTTP clients on the loopback, with
# faults applied to Redis during the run. Per scenario: the grants against the limiter's
# bound, Redis commands per 1,000 decisions, 5xx, the slowest request and whether a
# server's breaker opened; then a markdown table of all of them.
#
#   bash scripts/lease_stress.sh                        # every scenario below
#   bash scripts/lease_stress.sh flood-leased kill      # some of them
#   N=4 DURATION=10 RATE=8000 CONNS=8 bash scripts/lease_stress.sh sleep-unleased
#   LOGS=/tmp/stress-logs bash scripts/lease_stress.sh blackhole   # keep the servers' logs
#
# The limit: one rule, `key = "global"`, `quota = "1000/s; burst=100"` (LIMIT, BURST),
# with `lease = "auto"` (leased: each instance takes batches of tokens from the Redis
# bucket and decides locally) or without a lease (one Redis call per decision, batched).
# Each server gets the rules file written to the temporary folder; the default failure
# policy (`fallback`) applies.
#
# A scenario is a fault, then modifiers joined with '-':
#   flood       no fault, flood load (the default load of `flood` only)
#   paced       no fault, paced load
#   sleep       `DEBUG SLEEP 2` at 3 s (Redis answers nothing for 2 s, then everything)
#   stop        SIGSTOP Redis at 3 s, SIGCONT at 6 s
#   kill        kill -9 Redis at 3 s, restarted empty at 4 s
#   snapshot    BGSAVE at 1 s (the dump kept), kill -9 at 5 s, restarted at 6 s from
#               the 1-s dump (an older snapshot: the epoch marker is in it)
#   delay       the servers reach Redis through tcp_proxy, DELAY_MS (30) each way; paced
#               at RATE_UNDER (500/s), under the limit
#   blackhole   the servers reach Redis through tcp_proxy; black hole from 3 s to 8 s
#               (connections accepted, nothing forwarded; those that saw it stay dead for
#               good: `-hold` delivers their bytes once it ends instead)
# modifiers: leased (default) | unleased; flood | paced; hold (blackhole only).
# The default list: flood-leased flood-unleased sleep stop kill snapshot delay blackhole.
#
# Loads (benches/src/bin/http_load.rs), spread evenly over the N ports, for DURATION seconds
# (then 2 s of grace for the answers still due):
#   flood   CONNS (8) connections per server, each sending back-to-back: saturates a
#           small machine, as `wrk -t1 -c8` per server does
#   paced   RATE (8000, 8x the limit) requests a second in all, CONNS per server, each
#           connection on its own interval (ticks missed during a stall are skipped)
#
# Figures per scenario:
#   grants   2xx answers over the run
#   bound    what an exact limiter grants over the run, burst + rate x d, d the time from
#            the first request to the last answer; leased, + N x L, L the lease cap (an
#            eighth of the burst for lease "auto", src/model/lease.rs: 12 for burst 100)
#   ratio    grants / bound: above 1, the limit was exceeded
#   target   (detail line) the issue's target: 1.01 x (burst + rate x d) + N x L for the
#            floods; + one burst + 10 % of rate x outage for sleep, stop, blackhole;
#            + one burst + rate x outage for kill and snapshot (the outage's term)
#   Redis cmds/1k   every command Redis ran (INFO commandstats, sum of calls=, after
#            CONFIG RESETSTAT at the start, summed over a restart; the script's own INFO,
#            CONFIG, DEBUG, BGSAVE left out) per 1,000 decisions (every answered request).
#            Redis counts the commands a Lua script runs (redis.call) as well as the call
#            itself: a decision in one EVALSHA shows as several commands
#   script calls/1k   the EVAL/EVALSHA/FCALL calls alone: the round trips that carry
#            decisions and leases
#   5xx      5xx answers; transport errors and requests unanswered 2 s after the run are
#            in the detail line
#   slowest  the slowest request, sent to last byte (an unanswered one: until given up)
#   breaker opened   "is failing" lines in the servers' logs (the store's breaker
#            opening), and how many
#
# Each scenario starts from an empty Redis and new server processes, and takes about
# DURATION + 4 s. Client, servers and Redis share the machine's cores: on 2 cores, a
# flood saturates them (that is its point). Everything listens on 127.0.0.1 only; every
# process started is stopped on exit.
#
# Needs redis-server and redis-cli (Debian: redis-server redis-tools) and python3.
# BIN_DIR: a folder with prebuilt rules_server, http_load and tcp_proxy (and optionally
# tollgate-rules, to check the rules files); otherwise they are built here (release).
set -euo pipefail
cd "$(dirname "$0")/.."

N="${N:-4}"
DURATION="${DURATION:-10}"
RATE="${RATE:-8000}"
RATE_UNDER="${RATE_UNDER:-500}"
CONNS="${CONNS:-8}"
DELAY_MS="${DELAY_MS:-30}"
LIMIT="${LIMIT:-1000}"
BURST="${BURST:-100}"
LOGS="${LOGS:-}"
# The lease cap of lease = "auto": an eighth of the burst, at least 1.
L=$((BURST / 8 > 0 ? BURST / 8 : 1))

if [ $# -gt 0 ]; then
  scenarios=("$@")
else
  scenarios=(flood-leased flood-unleased sleep stop kill snapshot delay blackhole)
fi

for tool in redis-server redis-cli python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$tool not found (Debian: apt-get install redis-server redis-tools python3)" >&2; exit 1; }
done

target="${CARGO_TARGET_DIR:-target}"
if [ -n "${BIN_DIR:-}" ]; then
  server="$BIN_DIR/rules_server"
  load="$BIN_DIR/http_load"
  proxy="$BIN_DIR/tcp_proxy"
  rules_check="$BIN_DIR/tollgate-rules"
else
  echo "==> cargo build --release: rules_server, tollgate-rules (tollgate), http_load, tcp_proxy (tollgate-bench)"
  cargo build --release --quiet -p tollgate --example rules_server --bin tollgate-rules --features rules,redis
  cargo build --release --quiet -p tollgate-bench --bin http_load --bin tcp_proxy
  server="$target/release/examples/rules_server"
  load="$target/release/http_load"
  proxy="$target/release/tcp_proxy"
  rules_check="$target/release/tollgate-rules"
fi

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The throwaway Redis ($port, $dir, start_redis). Its start_redis is redefined with
# `--enable-debug-command local` (Redis 7 refuses DEBUG SLEEP otherwise, and it cannot be
# set at run time), and the server it started restarted with it.
# shellcheck source=scripts/throwaway_redis.sh
source scripts/throwaway_redis.sh
start_redis() {
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
    --enable-debug-command local \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
}
redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 || break; sleep 0.1; done
start_redis

server_pids=()
proxy_pid=""
load_pid=""
side_pid=""
# Replaces throwaway_redis.sh's trap: stops what this script started (a stopped Redis is
# continued first, or it would not shut down), then removes the folder.
cleanup() {
  for pid in "${server_pids[@]}" $proxy_pid $load_pid $side_pid; do kill "$pid" 2>/dev/null || true; done
  if [ -f "$dir/redis.pid" ]; then
    kill -CONT "$(cat "$dir/redis.pid")" 2>/dev/null || true
    timeout 5 redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 ||
      kill -9 "$(cat "$dir/redis.pid")" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The rules files, leased and not; checked with tollgate-rules when it is there.
for lease in auto none; do
  {
    echo '# Written by scripts/lease_stress.sh: one limit for every request.'
    echo '[[limits]]'
    echo 'name = "global"'
    echo 'key = "global"'
    echo "quota = \"$LIMIT/s; burst=$BURST\""
    if [ "$lease" = auto ]; then echo 'lease = "auto"'; fi
  } >"$dir/rules-$lease.toml"
  if [ -x "$rules_check" ]; then "$rules_check" check "$dir/rules-$lease.toml" >/dev/null; fi
done

# Two sums of calls= in INFO commandstats since the last reset: every command (those the
# Lua scripts run included), then the script calls alone (EVAL, EVALSHA, FCALL and their
# _ro forms). The script's own commands are left out.
own_commands='^cmdstat_(info|config|config\|[a-z]+|debug|bgsave):'
redis_calls() {
  redis-cli -p "$port" info commandstats | tr -d '\r' | grep -vE "$own_commands" |
    sed -nE 's/^cmdstat_([^:]*):calls=([0-9]+).*/\1 \2/p' |
    awk '{ n += $2 } $1 ~ /^(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro)$/ { s += $2 }
         END { print n + 0, s + 0 }'
}

# INFO commandstats as "name=calls ..." (the script's own left out), for the detail line.
redis_breakdown() {
  redis-cli -p "$port" info commandstats | tr -d '\r' |
    grep -vE "$own_commands" |
    sed -nE 's/^cmdstat_([^:]*):calls=([0-9]+).*/\1=\2/p' | tr '\n' ' '
}

# Sleeps until $1 seconds after $t0 (the load's start); at once if that is past.
at() {
  sleep "$(awk -v t0="$t0" -v t="$1" -v now="$(date +%s.%N)" \
    'BEGIN { d = t0 + t - now; if (d < 0) d = 0; printf "%.3f", d }')"
}

# Starts N servers with the rules of $1 (auto | none) on Redis at $2; waits until they
# listen. Their ports in $ports (comma-separated), their logs in $dir/run/server-*.log.
start_servers() {
  local lease=$1 url=$2 i p log ports_list=()
  server_pids=()
  for ((i = 1; i <= N; i++)); do
    p=$(free_port)
    log="$dir/run/server-$i.log"
    # NO_COLOR: plain log lines (tracing writes colours even to a file otherwise).
    # LEASE_STATS: the server prints what lease mode decided, once a second.
    NO_COLOR=1 LEASE_STATS=1 RULES="$dir/rules-$lease.toml" PORT="$p" REDIS_URL="$url" "$server" >"$log" 2>&1 &
    server_pids+=($!)
    ports_list+=("$p")
  done
  for ((i = 1; i <= N; i++)); do
    log="$dir/run/server-$i.log"
    for _ in $(seq 200); do
      if grep -q '^listening' "$log" 2>/dev/null; then break; fi
      if ! kill -0 "${server_pids[$((i - 1))]}" 2>/dev/null; then
        echo "server $i exited:" >&2
        cat "$log" >&2
        exit 1
      fi
      sleep 0.05
    done
    grep -q '^listening' "$log" || { echo "server $i did not start within 10 s:" >&2; cat "$log" >&2; exit 1; }
  done
  ports=$(IFS=,; echo "${ports_list[*]}")
}

stop_servers() {
  for pid in "${server_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${server_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  server_pids=()
}

# Runs one scenario; appends its figures to $dir/results (one line of JSON).
run_scenario() {
  local scenario=$1 fault lease=auto kind="" hold=0 url outage=0 calls_before="0 0" m
  local parts
  IFS=- read -ra parts <<<"$scenario"
  fault=${parts[0]}
  case "$fault" in
    flood) kind=flood; fault=none ;;
    paced) kind=paced; fault=none ;;
    sleep) outage=2 ;;
    stop) outage=3 ;;
    kill | snapshot) outage=1 ;;
    delay) ;;
    blackhole) outage=5 ;;
    *) echo "unknown scenario $scenario (flood paced sleep stop kill snapshot delay blackhole)" >&2; exit 2 ;;
  esac
  for m in "${parts[@]:1}"; do
    case "$m" in
      leased) lease=auto ;;
      unleased) lease=none ;;
      flood | paced) kind=$m ;;
      hold) hold=1 ;;
      *) echo "unknown modifier $m in $scenario (leased unleased flood paced hold)" >&2; exit 2 ;;
    esac
  done
  kind=${kind:-paced}

  # A clean start: an empty Redis, no dump, new servers.
  rm -rf "$dir/run" "$dir/dump.rdb" "$dir/older.rdb"
  mkdir -p "$dir/run"
  redis-cli -p "$port" flushall >/dev/null
  url="redis://127.0.0.1:$port/"
  if [ "$fault" = delay ] || [ "$fault" = blackhole ]; then
    local pport delay=0 mode=drop
    pport=$(free_port)
    if [ "$fault" = delay ]; then delay=$DELAY_MS; fi
    if [ "$hold" = 1 ]; then mode=hold; fi
    "$proxy" --listen "127.0.0.1:$pport" --to "127.0.0.1:$port" --delay-ms "$delay" \
      --blackhole "$mode" >"$dir/run/proxy.log" 2>&1 &
    proxy_pid=$!
    for _ in $(seq 100); do grep -q '^listening' "$dir/run/proxy.log" 2>/dev/null && break; sleep 0.05; done
    url="redis://127.0.0.1:$pport/"
  fi
  start_servers "$lease" "$url"
  redis-cli -p "$port" config resetstat >/dev/null

  local load_args=(--ports "$ports" --seconds "$DURATION" --conns "$CONNS")
  case "$kind" in
    flood) load_args+=(--flood) ;;
    paced) if [ "$fault" = delay ]; then load_args+=(--rate "$RATE_UNDER"); else load_args+=(--rate "$RATE"); fi ;;
  esac
  echo "==> $scenario: $N servers, lease ${lease}, $kind load (${load_args[*]:6}), fault $fault, ${DURATION}s" >&2
  t0=$(date +%s.%N)
  "$load" "${load_args[@]}" >"$dir/run/load.json" &
  load_pid=$!

  local rpid
  case "$fault" in
    sleep)
      at 3
      redis-cli -p "$port" debug sleep 2 >/dev/null &
      side_pid=$!
      echo "    3 s: DEBUG SLEEP 2" >&2
      wait "$side_pid" || true
      side_pid=""
      ;;
    stop)
      rpid=$(cat "$dir/redis.pid")
      at 3
      kill -STOP "$rpid"
      echo "    3 s: SIGSTOP redis-server" >&2
      at 6
      kill -CONT "$rpid"
      echo "    6 s: SIGCONT" >&2
      ;;
    kill)
      at 3
      calls_before=$(redis_calls)
      kill -9 "$(cat "$dir/redis.pid")"
      echo "    3 s: kill -9 redis-server" >&2
      at 4
      start_redis
      redis-cli -p "$port" config resetstat >/dev/null
      echo "    4 s: restarted empty" >&2
      ;;
    snapshot)
      at 1
      redis-cli -p "$port" bgsave >/dev/null
      for _ in $(seq 100); do
        redis-cli -p "$port" info persistence | tr -d '\r' | grep -q '^rdb_bgsave_in_progress:0' && break
        sleep 0.02
      done
      cp "$dir/dump.rdb" "$dir/older.rdb"
      echo "    1 s: BGSAVE, the dump kept" >&2
      at 5
      calls_before=$(redis_calls)
      kill -9 "$(cat "$dir/redis.pid")"
      echo "    5 s: kill -9 redis-server" >&2
      cp "$dir/older.rdb" "$dir/dump.rdb"
      at 6
      start_redis
      redis-cli -p "$port" config resetstat >/dev/null
      rm -f "$dir/dump.rdb"
      echo "    6 s: restarted from the 1-s dump" >&2
      ;;
    blackhole)
      at 3
      kill -USR1 "$proxy_pid"
      echo "    3 s: black hole on ($([ "$hold" = 1 ] && echo hold || echo drop))" >&2
      at 8
      kill -USR1 "$proxy_pid"
      echo "    8 s: black hole off" >&2
      ;;
  esac
  wait "$load_pid" || { echo "http_load failed" >&2; exit 1; }
  load_pid=""
  local calls script_calls breaker writebacks local_share
  # Before a kill and after the restart, summed.
  read -r calls script_calls < <(echo "$(redis_calls) $calls_before" | awk '{ print $1 + $3, $2 + $4 }')
  echo "    Redis commands$([ "$calls_before" != "0 0" ] && echo ' since the restart'): $(redis_breakdown)" >&2
  stop_servers
  if [ -n "$proxy_pid" ]; then
    kill "$proxy_pid" 2>/dev/null || true
    wait "$proxy_pid" 2>/dev/null || true
    proxy_pid=""
  fi
  breaker=$(cat "$dir"/run/server-*.log | grep -c 'is failing' || true)
  writebacks=$(cat "$dir"/run/server-*.log | grep -c 'writing back' || true)
  # Leased checks decided without a call (allowed or refused here), from each server's last
  # `lease stats:` line (printed once a second; the last second is not in it): a share.
  local_share=$(for f in "$dir"/run/server-*.log; do grep 'lease stats:' "$f" | tail -n 1; done |
    awk -F'[= ]' '{ for (i = 1; i <= NF; i++) { if ($i == "local_allowed" || $i == "local_refused") l += $(i + 1); if ($i == "remote") r += $(i + 1) } }
      END { if (l + r > 0) printf "%.4f", l / (l + r); else print -1 }')
  if [ -n "$LOGS" ]; then
    mkdir -p "$LOGS/$scenario"
    cp "$dir"/run/*.log "$LOGS/$scenario/"
  fi

  python3 - "$dir/run/load.json" "$scenario" "$fault" "$lease" "$kind" "$N" "$LIMIT" "$BURST" "$L" \
    "$outage" "$calls" "$script_calls" "$breaker" "$writebacks" "$local_share" >>"$dir/results" <<'PY'
import json, sys
path, scenario, fault, lease, kind = sys.argv[1:6]
n, limit, burst, cap, outage, calls, scripts, breaker, writebacks, local = map(float, sys.argv[6:16])
r = json.load(open(path))
d = r["span_s"]
exact = burst + limit * d
bound = exact + (n * cap if lease == "auto" else 0)
lease_term = n * cap if lease == "auto" else 0
if fault == "none" or fault == "delay":
    target = 1.01 * exact + lease_term
elif fault in ("kill", "snapshot"):
    target = bound + burst + limit * outage
else:
    target = bound + burst + 0.1 * limit * outage
decisions = r["answered"]
r.update(
    scenario=scenario, fault=fault, lease=lease, bound=round(bound), target=round(target),
    ratio=r["granted"] / bound, redis_calls=int(calls), script_calls=int(scripts),
    calls_per_1k=1000 * calls / decisions if decisions else 0.0,
    scripts_per_1k=1000 * scripts / decisions if decisions else 0.0,
    breaker=int(breaker), writebacks=int(writebacks), local_share=local,
)
print(json.dumps(r))
PY
  python3 - "$dir/results" <<'PY' >&2
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print(f"    {r['granted']} granted of {r['answered']} answered (429: {r['limited']}, 5xx: {r['server_error']}, "
      f"other: {r['other']}; transport errors {r['transport_errors']}, unanswered {r['unanswered']}) "
      f"in {r['span_s']:.2f} s")
print(f"    bound {r['bound']} (ratio {r['ratio']:.3f}), target {r['target']}; Redis {r['redis_calls']} commands "
      f"({r['calls_per_1k']:.2f} per 1,000 decisions), {r['script_calls']} of them script calls "
      f"({r['scripts_per_1k']:.2f} per 1,000); slowest {r['slowest_ms']:.0f} ms (sent at "
      f"{r['slowest_at_s']:.2f} s); 'is failing' {r['breaker']}x, 'writing back' {r['writebacks']}x")
if r["local_share"] >= 0:
    print(f"    leased checks decided without a call: {100 * r['local_share']:.1f} %")
print(f"    grants per second: {' '.join(map(str, r['granted_per_s']))}")
PY
}

if [ "$DURATION" -lt 9 ]; then
  echo "note: the faults come at 1 to 8 s: with DURATION=$DURATION some fall after the load" >&2
fi
echo "==> $N servers, limit $LIMIT/s burst $BURST (lease cap L = $L), ${DURATION} s a scenario, $(nproc) cores" >&2
for s in "${scenarios[@]}"; do
  run_scenario "$s"
done

python3 - "$dir/results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print()
print("| scenario | decisions | grants | bound | ratio | Redis cmds/1k | script calls/1k | leased, no call | 5xx | slowest | breaker opened |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for r in rows:
    opened = f"yes ({r['breaker']})" if r["breaker"] else "no"
    local = f"{100 * r['local_share']:.1f} %" if r.get("local_share", -1) >= 0 else "—"
    print(f"| {r['scenario']} | {r['answered']:,} | {r['granted']:,} | {r['bound']:,} | {r['ratio']:.2f} "
          f"| {r['calls_per_1k']:.2f} | {r['scripts_per_1k']:.2f} | {local} | {r['server_error']:,} | {r['slowest_ms']:,.0f} ms | {opened} |")
PY

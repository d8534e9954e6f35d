#!/usr/bin/env bash
# One limit across regions measured with separate processes (issue 43's table): two Redis
# servers ("eu", "us"), a proxy process for each direction of the link between them
# (DELAY_MS each way; a black hole while a file exists), and one process per region
# (tests/bin/region_process.rs: that region's instance, checking the limit at a paced
# demand, and its mover). The limit: LIMIT/s with a burst of BURST (1,000 and 1,000),
# split between the two regions; the movers every INTERVAL_MS (100), configured with
# the link's delay (DELAY_MS, 80).
#
#   bash scripts/regions_stress.sh                  # every scenario
#   bash scripts/regions_stress.sh shift partition  # some
#
# Scenarios (the demand is requests a second per region):
#   shift      20 s, 2x the limit in all: 90 % / 10 % for 5 s, moving to 10 % / 90 % over
#              10 s, then 5 s more. Targets: the grants of any 10 s window <= 1.05 x one
#              global bucket's bound (BURST + LIMIT x 10); the run's grants >= 0.9 x what
#              one global bucket grants over it (BURST + LIMIT x 20).
#   partition  50 s, 90 % / 10 % at 2x; the link black-holed from 10 s to 40 s. Targets:
#              any 10 s window inside the partition <= 1.0 x one global bucket's bound
#              (+ 1 token per region), any window <= 1.05 x; the last 10 s (healed) grant
#              >= 0.9 x LIMIT x 10 (the split recovered).
#   kill       25 s, 75 % / 25 % at 2x (us at its part); us's Redis killed with kill -9
#              at 8 s, restarted empty at 13 s. Target: the run's grants <= the regions'
#              bound + us's outage term (its part's burst + rate x 5 s).
#   under      20 s, 400/s in each region (0.8x), then one region alone at 400/s (the same
#              process with a single region: its own Redis, no link) for the latency. Targets: 0 refused; p99 latency
#              like one region alone.
#
# Every 100 ms slot of each region is counted (granted, refused, by the failure policy);
# windows slide by 100 ms. The link's calls are counted by the proxies (chunks forwarded
# from the movers' side: about one per call).
#
# Needs redis-server, redis-cli and python3. Builds region_process (debug, feature redis)
# unless BIN is set to it.
set -euo pipefail
cd "$(dirname "$0")/.."

LIMIT="${LIMIT:-1000}"
BURST="${BURST:-1000}"
DELAY_MS="${DELAY_MS:-80}"
INTERVAL_MS="${INTERVAL_MS:-100}"

if [ $# -gt 0 ]; then scenarios=("$@"); else scenarios=(shift partition kill under); fi

for tool in redis-server redis-cli python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$tool not found" >&2; exit 1; }
done
if [ -z "${BIN:-}" ]; then
  cargo build --quiet -p tollgate-tests --features redis --bin region_process
  BIN="${CARGO_TARGET_DIR:-target}/debug/region_process"
fi

work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for f in "$work"/*/redis.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_redis() { # name port
  mkdir -p "$work/$1"
  rm -f "$work/$1/redis.pid"
  redis-server --port "$2" --bind 127.0.0.1 --save '' --appendonly no --dir "$work/$1" \
    --daemonize yes --pidfile "$work/$1/redis.pid" --logfile "$work/$1/redis.log"
  for _ in $(seq 100); do redis-cli -p "$2" ping >/dev/null 2>&1 && return; sleep 0.05; done
  echo "redis $1 did not start" >&2; exit 1
}

start_proxy() { # name listen to
  "$BIN" proxy "$2" "$3" "$DELAY_MS" "$work/hole" "$work/$1.count" >"$work/$1.proxy.out" &
  pids+=($!)
  for _ in $(seq 100); do grep -q ready "$work/$1.proxy.out" 2>/dev/null && return; sleep 0.05; done
  echo "proxy $1 did not start" >&2; exit 1
}

# at SECONDS: waits until that many seconds after the run's start.
at() { python3 -c "import time; time.sleep(max(0, ($run_start + $1 * 1000) / 1000 - time.time()))"; }

# run SCENARIO SECONDS EU_DEMAND US_DEMAND [ALONE_DEMAND]: the processes, then the figures.
run() {
  local name="$1" seconds="$2" eu_demand="$3" us_demand="$4"
  rm -rf "${work:?}"/*
  local eu_port us_port to_us to_eu
  eu_port="$(free_port)"; us_port="$(free_port)"; to_us="$(free_port)"; to_eu="$(free_port)"
  start_redis eu "$eu_port"
  start_redis us "$us_port"
  start_proxy to_us "$to_us" "$us_port"
  start_proxy to_eu "$to_eu" "$eu_port"
  local start=$(( $(date +%s%3N) + 1500 ))
  local common=("$LIMIT" "$BURST" "$INTERVAL_MS" "$DELAY_MS" "$start" "$seconds")
  "$BIN" region eu eu,us "redis://127.0.0.1:$eu_port,redis://127.0.0.1:$to_us" \
    "${common[@]}" "$eu_demand" "$work/eu.out" &
  local eu_pid=$!
  "$BIN" region us eu,us "redis://127.0.0.1:$to_eu,redis://127.0.0.1:$us_port" \
    "${common[@]}" "$us_demand" "$work/us.out" &
  local us_pid=$!
  run_start="$start"
  case "$name" in
    partition)
      at 10; touch "$work/hole"
      at 40; rm -f "$work/hole"
      ;;
    kill)
      at 8; kill -9 "$(cat "$work/us/redis.pid")"
      at 13; start_redis us "$us_port"
      ;;
  esac
  wait "$eu_pid" "$us_pid"
  local calls_to_us calls_to_eu
  calls_to_us="$(cat "$work/to_us.count" 2>/dev/null || echo 0)"
  calls_to_eu="$(cat "$work/to_eu.count" 2>/dev/null || echo 0)"
  local alone=""
  if [ "$name" = under ]; then
    local a_port; a_port="$(free_port)"
    start_redis alone "$a_port"
    start=$(( $(date +%s%3N) + 1000 ))
    "$BIN" region eu eu "redis://127.0.0.1:$a_port" "$LIMIT" "$BURST" "$INTERVAL_MS" \
      "$DELAY_MS" "$start" "$seconds" "$eu_demand" "$work/alone.out"
    alone="$work/alone.out"
  fi
  python3 - "$name" "$seconds" "$work/eu.out" "$work/us.out" "$calls_to_us" "$calls_to_eu" "$alone" <<'PY'
import math, sys
name, seconds, eu_f, us_f, to_us, to_eu, alone = sys.argv[1:8]
seconds = int(seconds)
import os
LIMIT, BURST = int(os.environ["LIMIT"]), int(os.environ["BURST"])
D, I = int(os.environ["DELAY_MS"]) / 1e3, int(os.environ["INTERVAL_MS"]) / 1e3
def read(f):
    slots, lat, mover = [], None, None
    for line in open(f):
        p = line.split()
        if p[0] == "slot": slots.append(tuple(map(int, p[2:5])))
        elif p[0] == "latency": lat = tuple(map(int, p[1:5]))
        elif p[0] == "mover": mover = tuple(map(int, p[1:4]))
    return slots, lat, mover
eu, eu_lat, eu_mv = read(eu_f)
us, us_lat, us_mv = read(us_f)
n = 2
M = math.ceil(LIMIT * (I + 2 * D))
def bound(T, m=M): return BURST + math.ceil(LIMIT * T) + n * (m + 1)
def one(T): return BURST + math.ceil(LIMIT * T)
g = [a[0] + b[0] for a, b in zip(eu, us)]
def window_max(lo, hi, w=100):
    hi = min(hi, len(g))
    return max(sum(g[i:i + w]) for i in range(lo, max(lo + 1, hi - w + 1)))
tot = sum(g)
ref = sum(a[1] + b[1] for a, b in zip(eu, us))
fb = sum(a[2] + b[2] for a, b in zip(eu, us))
print(f"\n== {name}: {seconds} s, limit {LIMIT}/s burst {BURST}, link {D*1e3:.0f} ms each way, movers every {I*1e3:.0f} ms, M = {M}")
print(f"granted {tot} (eu {sum(a[0] for a in eu)}, us {sum(b[0] for b in us)}), refused {ref}, by a failure policy {fb}; sent {tot + ref} ({(tot + ref) / seconds:.0f}/s)")
print(f"latency p50/p99/max (us): eu {eu_lat[0]}/{eu_lat[1]}/{eu_lat[2]}, us {us_lat[0]}/{us_lat[1]}/{us_lat[2]}")
print(f"movers: eu moved {eu_mv[0]} in {eu_mv[1]} transfers ({eu_mv[2]} failed calls); us moved {us_mv[0]} in {us_mv[1]} ({us_mv[2]} failed)")
print(f"calls over the link (one key): eu->us {int(to_us)}, us->eu {int(to_eu)}: {(int(to_us) + int(to_eu)) / seconds:.1f}/s in all")
w10 = window_max(0, len(g))
print(f"max grants in a 10 s window: {w10}; one global bucket's bound {one(10)} (ratio {w10 / one(10):.3f}; target <= 1.05); regions' bound {bound(10)}")
if name == "shift":
    print(f"run: {tot} of one global bucket's {one(seconds)} ({tot / one(seconds):.3f}; target >= 0.9)")
if name == "partition":
    wp = window_max(100, 400)
    print(f"inside the partition (10-40 s), max 10 s window: {wp} ({wp / (one(10) + n):.3f} of one bucket's bound + n; target <= 1.0)")
    per = [sum(g[i:i + 10]) for i in range(0, len(g) - 1, 10)]
    print("grants per second:", " ".join(map(str, per)))
    last = sum(g[400:500])
    print(f"healed, 40-50 s: {last} ({last / (LIMIT * 10):.3f} of the rate; target >= 0.9)")
if name == "kill":
    usp_b, usp_r = BURST // 2, LIMIT // 2
    extra = usp_b + usp_r * 5
    print(f"run: {tot} against the regions' bound {bound(seconds)} + us's outage term {extra} = {bound(seconds) + extra} ({tot / (bound(seconds) + extra):.3f})")
    per = [sum(g[i:i + 10]) for i in range(0, len(g) - 1, 10)]
    print("grants per second:", " ".join(map(str, per)))
    print("us by its failure policy per second:", " ".join(str(sum(b[2] for b in us[i:i + 10])) for i in range(0, len(us) - 1, 10)))
if alone:
    a, a_lat, _ = read(alone)
    print(f"one region alone (the same process with one region: its own Redis, no link): p50/p99/max {a_lat[0]}/{a_lat[1]}/{a_lat[2]} us, refused {sum(x[1] for x in a)}")
PY
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  pids=()
  for f in "$work"/*/redis.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
}

export LIMIT BURST DELAY_MS INTERVAL_MS
for s in "${scenarios[@]}"; do
  case "$s" in
    shift) run shift 20 "0:$((LIMIT * 18 / 10)),5:$((LIMIT * 18 / 10)),15:$((LIMIT * 2 / 10)),20:$((LIMIT * 2 / 10))" \
                        "0:$((LIMIT * 2 / 10)),5:$((LIMIT * 2 / 10)),15:$((LIMIT * 18 / 10)),20:$((LIMIT * 18 / 10))" ;;
    partition) run partition 50 "0:$((LIMIT * 18 / 10))" "0:$((LIMIT * 2 / 10))" ;;
    kill) run kill 25 "0:$((LIMIT * 15 / 10))" "0:$((LIMIT * 5 / 10))" ;;
    under) run under 20 "0:$((LIMIT * 4 / 10))" "0:$((LIMIT * 4 / 10))" ;;
    *) echo "unknown scenario $s" >&2; exit 2 ;;
  esac
done

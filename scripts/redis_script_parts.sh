#!/usr/bin/env bash
# What each part of lua/gcra.lua costs Redis per decision, from INFO commandstats, in units
# of one INCR of the same server.
#
#   bash scripts/redis_script_parts.sh [rounds]   # 5 by default, about 2 minutes
#
# Starts a throwaway redis-server on a free port and runs, with redis-benchmark (-c 8), one
# EVALSHA of B requests of one GCRA limit each (distinct keys; every request passes and
# writes its key), for B = 1, 16 and 64, of three scripts:
#   frame   what every call pays: TIME, one MGET of the keys, the reply (no decision);
#   writes  the frame plus one SET … PX per key from Lua, the write a decision cannot skip;
#   gcra    the script the store sends (lua/window.lua + lua/gcra.lua).
# `writes - frame` is the write, `gcra - writes` the decision's own Lua. Rounds interleave
# the scripts (the machine's load moves single runs); each figure is the median.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"

source scripts/throwaway_redis.sh

frame="local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local read = redis.call('MGET', unpack(KEYS))
local reply, n = { now }, 1
for i = 1, #KEYS do
  WRITE
  reply[n + 1], reply[n + 2], reply[n + 3] = 0, 1000, 0
  n = n + 3
end
return reply"
declare -A sha
write="redis.call('SET', KEYS[i], now + 1000, 'PX', 1000)"
sha[frame]=$(redis-cli -p "$port" SCRIPT LOAD "${frame/WRITE/}")
sha[writes]=$(redis-cli -p "$port" SCRIPT LOAD "${frame/WRITE/"$write"}")
sha[gcra]=$(redis-cli -p "$port" SCRIPT LOAD "$(cat lua/window.lua lua/gcra.lua)")

usec() {
  redis-cli -p "$port" info commandstats | tr -d '\r' | grep "^cmdstat_$1:" \
    | sed -E 's/.*usec_per_call=([0-9.]+).*/\1/'
}
reset() { redis-cli -p "$port" flushall >/dev/null; redis-cli -p "$port" config resetstat >/dev/null; }

declare -A runs
for _ in $(seq "$rounds"); do
  reset
  # The unit as scripts/redis_compare.sh measures it.
  redis-benchmark -p "$port" -P 16 -c 64 -n 400000 -r 10000 -q INCR 'k:__rand_int__' >/dev/null
  runs[incr]+="$(usec incr) "
  for b in 1 16 64; do
    keys=() args=('')
    for i in $(seq "$b"); do keys+=("k$i"); args+=(1 1 1000000000 1 1 ''); done
    for script in frame writes gcra; do
      reset
      redis-benchmark -p "$port" -c 8 -n $((100000 / b + 100)) -q \
        EVALSHA "${sha[$script]}" "$b" "${keys[@]}" "${args[@]}" >/dev/null
      runs[$script,$b]+="$(python3 -c "print($(usec evalsha) / $b)") "
    done
  done
done

median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
incr=$(median "${runs[incr]}")
printf 'INCR: %s us per call (median of %s rounds): the unit below\n\n' "$incr" "$rounds"
printf '%-8s %22s %22s %22s\n' "B" "frame us (x INCR)" "writes us (x INCR)" "gcra us (x INCR)"
for b in 1 16 64; do
  row=""
  for script in frame writes gcra; do
    m=$(median "${runs[$script,$b]}")
    row+=$(printf '%22s' "$(python3 -c "print(f'{$m:.2f} ({$m / $incr:.1f})')")")
  done
  printf '%-8s %s\n' "$b" "$row"
done
echo
echo "(per decision: a call's time / B)"

--[[
tollgate: a key's ban state (bans that escalate; `src/model/ban.rs`, the memory side in
`src/engine/ban.rs`). Three keys, in the hash slot of the key's bucket:

KEYS[1]  the refusals counted since the first of the current `within` (PX = within)
KEYS[2]  the ban (PX = the ban's length)
KEYS[3]  the repeat level of the key's last ban (PX = its length + forget)

ARGV[1]  the operation:
  offend     a refusal: while banned, nothing is counted; otherwise counted, and the
             `after`-th within `within` begins a ban of for * escalate^level ms, at most
             max, where level is the last ban's level + 1 if that ban ended less than
             `forget` ago, else 0; the count starts afresh.
             ARGV[2] after, ARGV[3] within (ms), ARGV[4] for (ms), ARGV[5] escalate,
             ARGV[6] max (ms), ARGV[7] forget (ms)
  set        a ban of ARGV[2] ms from now; the count starts afresh, the level stays
  lift       the ban, the count and the level are deleted
  remaining  only reads

Reply: { ms the ban has left (-1: none), 1 if this call began the ban else 0, level }
]]

local op = ARGV[1]

local function level_of()
  return tonumber(redis.call('GET', KEYS[3]) or '-1')
end

if op == 'lift' then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
  return { -1, 0, 0 }
end

local left = redis.call('PTTL', KEYS[2])
if op == 'remaining' then
  if left > 0 then
    return { left, 0, math.max(level_of(), 0) }
  end
  return { -1, 0, 0 }
end

if op == 'set' then
  local ms = tonumber(ARGV[2])
  redis.call('SET', KEYS[2], '1', 'PX', ms)
  redis.call('DEL', KEYS[1])
  return { ms, 1, math.max(level_of(), 0) }
end

-- offend
if left > 0 then
  return { left, 0, math.max(level_of(), 0) }
end
local after = tonumber(ARGV[2])
local count = redis.call('INCR', KEYS[1])
if count == 1 then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
end
if count < after then
  return { -1, 0, 0 }
end
local for_ms = tonumber(ARGV[4])
local escalate = tonumber(ARGV[5])
local max_ms = tonumber(ARGV[6])
local forget_ms = tonumber(ARGV[7])
local level = level_of() + 1
if level > 64 then
  level = 64
end
local ms = math.floor(for_ms * escalate ^ level)
if ms > max_ms or ms ~= ms then
  ms = max_ms
end
if ms < 1 then
  ms = 1
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], '1', 'PX', ms)
redis.call('SET', KEYS[3], tostring(level), 'PX', ms + forget_ms)
return { ms, 1, level }

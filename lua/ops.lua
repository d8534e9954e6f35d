--[[
tollgate: one operation other than a check on GCRA buckets (design brief §10), atomically.

KEYS[i]  a bucket: its value is the TAT in microseconds since the Unix epoch; an absent key
         is a full bucket.

ARGV[1]  now, in microseconds since the Unix epoch, or "" to use Redis TIME
ARGV[2]  the operation: "refund", "penalize", "block" or "reset"
Then three arguments per key (ARGV[3i] ... ARGV[3i+2]):
  t        emission interval in microseconds (>= 1)
  burst    bucket capacity in tokens (>= 1)
  amount   refund, penalize: tokens; block: microseconds; reset: unused

  refund    TAT := max(now, TAT - amount * t): never beyond a full bucket; an absent key
            stays absent (a full bucket is deleted)
  penalize  TAT := max(TAT, now) + amount * t, without bound (debt)
  block     TAT := max(TAT, now + amount + burst * t - t): a request of cost 1 is refused
            until now + amount
  reset     the key is deleted: a full bucket, unblocked

A written key expires when its bucket is full again (PX = TAT - now in milliseconds,
rounded up, + 1), as gcra.lua's keys do.

A TAT is at most 2^53 - 1 microseconds (the year 2255): Lua numbers are doubles, and a
larger one (a block for Duration::MAX, a huge penalty) would be written and answered
inexactly, as a float the client cannot read. Capped there, it is still "for good".

Reply: an array of 1 + #KEYS integers: now, then each bucket's TAT afterwards (0: absent).
]]

local now
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[1])
end
local op = ARGV[2]
local MAX_TAT = 9007199254740991

local reply = { now }
for i = 1, #KEYS do
  local key = KEYS[i]
  local a = 3 * i
  local t = tonumber(ARGV[a])
  local burst = tonumber(ARGV[a + 1])
  local amount = tonumber(ARGV[a + 2])
  local tat = tonumber(redis.call('GET', key))
  local new
  if op == 'reset' then
    redis.call('DEL', key)
    new = 0
  elseif op == 'refund' then
    if tat == nil then
      new = 0
    else
      new = math.max(now, tat - amount * t)
    end
  elseif op == 'penalize' then
    new = math.max(tat or 0, now) + amount * t
  elseif op == 'block' then
    new = math.max(tat or 0, now + amount + burst * t - t)
  else
    return redis.error_reply('tollgate ops.lua: unknown operation ' .. tostring(op))
  end
  if new > MAX_TAT then
    new = MAX_TAT
  end
  if op ~= 'reset' then
    if new > now then
      redis.call('SET', key, new, 'PX', math.floor((new - now + 999) / 1000) + 1)
    elseif tat ~= nil then
      redis.call('DEL', key)
      new = 0
    end
  end
  reply[i + 1] = new
end
return reply

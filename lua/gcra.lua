--[[
tollgate: GCRA for every limit of one request, all or nothing.

The decision of `src/gcra.rs` (`gcra::decide`), in integer microseconds: every value stays
below 2^53, so Lua's doubles hold it exactly. The client derives what it tells clients
(tokens left, time to the next token, time until a refused request would pass) from the
reply with the same formulas the memory store uses, so both stores report alike; a
conformance suite runs both over the same cases.

KEYS[i]  the bucket of limit i. Its value is the theoretical arrival time (TAT) in
         microseconds since the Unix epoch; an absent key is a full bucket.

ARGV[1]  now, in microseconds since the Unix epoch, or "" to use Redis TIME (one clock for
         every app instance).
Then four arguments per limit, in KEYS order (ARGV[4i-2] ... ARGV[4i+1]):
  t        emission interval in microseconds (>= 1)
  burst    bucket capacity in tokens (>= 1)
  cost     tokens this request takes (0 looks without consuming)
  enforce  1 if the limit may refuse the request, 0 for a shadow limit

Reply: an array of 1 + 3 * #KEYS integers:
  now            the time used, in microseconds
  then, per limit, in KEYS order:
  verdict        0 allowed, 1 denied, 2 never (cost > burst)
  reset_after    microseconds until the bucket is full again, after this request
  previous       the TAT read (0 if absent), to undo a write exactly if needed

The request proceeds only if no enforcing limit is denied or never. Only then are the
consuming limits written (TAT = now + reset_after), each with PX = reset_after in
milliseconds (rounded up) + 1, so a key expires when its bucket is full again. Otherwise
nothing is written and the limits that would have allowed report their state unchanged.
]]

local now
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[1])
end

local n = #KEYS
local tats = redis.call('MGET', unpack(KEYS))
local verdicts, afters, writes = {}, {}, {}
local refused = false

for i = 1, n do
  local a = 4 * i - 2
  local t = tonumber(ARGV[a])
  local burst = tonumber(ARGV[a + 1])
  local cost = tonumber(ARGV[a + 2])
  local tat = tonumber(tats[i]) or 0
  tats[i] = tat
  local base = now
  if tat > now then
    base = tat
  end
  local verdict, after = 0, base
  if cost > burst then
    verdict = 2
  else
    local new_tat = base + cost * t
    if new_tat - now <= burst * t then
      after = new_tat
      if cost > 0 then
        writes[i] = new_tat
      end
    else
      verdict = 1
    end
  end
  if verdict ~= 0 and ARGV[a + 3] == '1' then
    refused = true
  end
  verdicts[i] = verdict
  afters[i] = after
end

local reply = { now }
for i = 1, n do
  local after = afters[i]
  if refused then
    if verdicts[i] == 0 then
      -- nothing is consumed: report the bucket as it stands
      after = math.max(tats[i], now)
    end
  elseif writes[i] then
    local w = writes[i]
    redis.call('SET', KEYS[i], w, 'PX', math.floor((w - now + 999) / 1000) + 1)
  end
  reply[3 * i - 1] = verdicts[i]
  reply[3 * i] = after - now
  reply[3 * i + 1] = tats[i]
end
return reply

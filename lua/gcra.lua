--[[
tollgate: GCRA for every limit of one request, all or nothing.

The same algorithm as `src/gcra.rs`, line for line, in integer microseconds (every value
stays below 2^53, so Lua's doubles hold it exactly). A parity test runs both over the same
cases.

KEYS[i]  the bucket of limit i. Its value is the theoretical arrival time (TAT) in
         microseconds since the Unix epoch; an absent key is a full bucket.

ARGV[1]  now, in microseconds since the Unix epoch, or "" to use Redis TIME (one clock for
         every app instance).
Then four arguments per limit, in KEYS order (ARGV[2 + 4(i-1)] ...):
  t        emission interval in microseconds (>= 1)
  burst    bucket capacity in tokens (>= 1)
  cost     tokens this request takes (0 looks without consuming)
  enforce  1 if the limit may refuse the request, 0 for a shadow limit

Reply: a flat array of 7 integers per limit, in KEYS order:
  verdict      0 allowed, 1 denied, 2 never (cost > burst)
  remaining    whole tokens left
  reset_after  microseconds until the bucket is full again
  next_after   microseconds until one more token, -1 while the bucket is full
  retry_after  microseconds until this request would pass, -1 if allowed or never
  written      the TAT this call wrote for the limit, -1 if none
  previous     the TAT it read (0 if absent), to undo the write exactly if needed

The request proceeds only if no enforcing limit is denied or never. Only then are the
consuming limits written, each with PX = reset_after in milliseconds (rounded up) + 1, so a
key expires when its bucket is full again. Otherwise nothing is written and the limits that
would have allowed report their state unchanged.
]]

local function idiv(a, b)
  -- floor(a / b) for non-negative integers, exact even where the double quotient rounds
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local now
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[1])
end

local n = #KEYS
local stored = redis.call('MGET', unpack(KEYS))

-- check(): verdict, the TAT after the request, the TAT to write (or nil), retry_after
local function check(t, burst, tat, cost)
  local tau = burst * t
  local base = math.max(tat, now)
  if cost > burst then
    return 2, base, nil, -1
  end
  local new_tat = base + cost * t
  if new_tat - now <= tau then
    if cost > 0 then
      return 0, new_tat, new_tat, -1
    end
    return 0, new_tat, nil, -1
  end
  return 1, base, nil, new_tat - now - tau
end

-- report(): remaining, reset_after, next_after for a bucket whose TAT is `after`
local function report(t, burst, after)
  local tau = burst * t
  local reset_after = after - now
  if reset_after > tau then
    -- only when the quota shrank since the TAT was written
    return 0, reset_after, reset_after - tau + t
  end
  local slack = tau - reset_after
  local remaining = idiv(slack, t)
  local next_after = -1
  if remaining < burst then
    next_after = t - (slack - remaining * t)
  end
  return remaining, reset_after, next_after
end

local limits = {}
local refused = false
for i = 1, n do
  local a = 2 + 4 * (i - 1)
  local l = {
    t = tonumber(ARGV[a]),
    burst = tonumber(ARGV[a + 1]),
    cost = tonumber(ARGV[a + 2]),
    enforce = ARGV[a + 3] == '1',
    tat = tonumber(stored[i]) or 0,
  }
  l.verdict, l.after, l.write, l.retry = check(l.t, l.burst, l.tat, l.cost)
  if l.enforce and l.verdict ~= 0 then
    refused = true
  end
  limits[i] = l
end

local reply = {}
for i = 1, n do
  local l = limits[i]
  local written = -1
  if l.verdict == 0 then
    if refused then
      -- nothing is consumed: report the bucket as it stands
      l.after = math.max(l.tat, now)
    elseif l.write then
      local remaining, reset_after = report(l.t, l.burst, l.write)
      redis.call('SET', KEYS[i], l.write, 'PX', idiv(reset_after + 999, 1000) + 1)
      written = l.write
    end
  end
  local remaining, reset_after, next_after = report(l.t, l.burst, l.after)
  local r = 7 * (i - 1)
  reply[r + 1] = l.verdict
  reply[r + 2] = remaining
  reply[r + 3] = reset_after
  reply[r + 4] = next_after
  reply[r + 5] = l.retry
  reply[r + 6] = written
  reply[r + 7] = l.tat
end
return reply

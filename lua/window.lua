--[[
tollgate: the window algorithms, `src/window.rs` line for line, in
integer microseconds. Prepended to gcra.lua and ops.lua (one script text each).

A window limit's arguments: len (W, µs), limit (L), and a kind string
"<code>:<phase>:<at>", or "<code>" alone when both are 0: code f (fixed window), s (sliding
window), l (sliding log) or k (a calendar window: len is this window's length, phase its
start in µs since the epoch, absolute; `now` is held inside it, and the key, which names
the window, expires at its end, so a late write cannot land in the next window); phase the fixed window's phase in µs (< W); at the instant of
the check being undone (ops.lua's "undo"), else 0. Every product stays below 2^53 (L × W < 2^52 is checked when the limit is
built), so doubles hold every value exactly; divisions go through `idiv`.

State, one string per key:
  fixed window    "<index>:<used>"   (calendar window: the same, index 0)
  sliding window  "<index>:<cur>:<prev>"
  sliding log     "<t> <n> <t> <n> ..."  (instants in µs and units, oldest first)
Absent: an empty window. A key expires when its state is worthless (PX = reset_after).
]]

local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function win_kind(kind)
  if #kind == 1 then
    return kind, 0, 0
  end
  local c = string.find(kind, ':', 3, true)
  return string.sub(kind, 1, 1), tonumber(string.sub(kind, 3, c - 1)),
    tonumber(string.sub(kind, c + 1))
end

-- A calendar window's `now`: held inside [start, start + len) (the caller worked out the
-- window from its own clock; Redis `TIME` may differ by a hair).
local function cal_now(code, phase, len, now)
  if code == 'k' then
    return math.min(math.max(now, phase), phase + len - 1)
  end
  return now
end

-- The window holding `now`: index, time into it, time to its end.
local function win_at(len, phase, now)
  local x = math.max(now - phase, 0)
  local index = idiv(x, len)
  local e = x - index * len
  return index, e, len - e
end

local function fixed_wait(limit, len, used, until_end, need)
  local k = math.max(idiv(used + need - limit + limit - 1, limit), 1)
  return until_end + (k - 1) * len
end

-- remaining, reset_after, next_after (0: none)
local function fixed_report(limit, len, used, until_end)
  local remaining = math.max(limit - used, 0)
  if used == 0 then
    return remaining, 0, 0
  elseif used <= limit then
    return remaining, until_end, until_end
  end
  local windows = idiv(used + limit - 1, limit)
  return remaining, until_end + (windows - 1) * len,
    fixed_wait(limit, len, used, until_end, remaining + 1)
end

local function sliding_fits(limit, len, cur, prev, e, cost)
  return prev * (len - e) + (cur + cost) * len <= limit * len
end

local function sliding_wait(limit, len, cur, prev, e, cost)
  if cur + cost <= limit and prev > 0 then
    local slack = math.min(idiv((limit - cur - cost) * len, prev), len)
    local e1 = len - slack
    if e1 < len then
      return math.max(e1 - e, 1)
    end
  end
  local e2 = 0
  if cur > 0 then
    e2 = len - math.min(idiv((limit - math.min(cost, limit)) * len, cur), len)
  end
  return (len - e) + e2
end

local function sliding_report(limit, len, cur, prev, e)
  local used = prev * (len - e) + cur * len
  local remaining = idiv(math.max(limit * len - used, 0), len)
  local reset = 0
  if cur > 0 then
    reset = 2 * len - e
  elseif prev > 0 then
    reset = len - e
  end
  local nxt = 0
  if remaining < limit and (cur > 0 or prev > 0) then
    nxt = sliding_wait(limit, len, cur, prev, e, remaining + 1)
  end
  return remaining, reset, nxt
end

-- The log of `value`, trimmed to (now - len, now]: instants, units, their sum.
local function log_read(value, len, now)
  local ts, ns, sum = {}, {}, 0
  if value then
    local t = nil
    for num in string.gmatch(value, '%d+') do
      if t == nil then
        t = tonumber(num)
      else
        local n = tonumber(num)
        if t + len > now then
          ts[#ts + 1] = t
          ns[#ns + 1] = n
          sum = sum + n
        end
        t = nil
      end
    end
  end
  return ts, ns, sum
end

local function log_report(limit, len, ts, used, now)
  local remaining = math.max(limit - used, 0)
  if used == 0 or #ts == 0 then
    return remaining, 0, 0
  end
  return remaining, ts[#ts] + len - now, math.max(ts[1] + len - now, 1)
end

local function log_wait(limit, len, ts, ns, used, cost, now)
  local free = used + cost - limit
  local wait = 0
  for j = 1, #ts do
    wait = math.max(ts[j] + len - now, 1)
    free = free - ns[j]
    if free <= 0 then
      break
    end
  end
  return wait
end

-- (Returns what the key now holds, false if deleted, as MGET would read it.)
local function log_write(key, ts, ns, len, now)
  if #ts == 0 then
    redis.call('DEL', key)
    return false
  end
  local parts = {}
  for j = 1, #ts do
    parts[#parts + 1] = string.format('%d %d', ts[j], ns[j])
  end
  local px = ts[#ts] + len - now
  local value = table.concat(parts, ' ')
  redis.call('SET', key, value, 'PX', idiv(px + 999, 1000) + 1)
  return value
end

-- The state of a fixed (a = used) or sliding (a = cur, b = prev) window at `index`, and
-- the stored index when it is later than `index` (written by a clock ahead of ours: the
-- caller then decides at that window's start, so as never to move the key back to an
-- earlier window, which would start the later one over empty).
local function win_read(code, value, limit, index)
  if not value then
    return 0, 0
  end
  -- one pattern match: fewer calls into C than finding and cutting each field
  if code == 'f' or code == 'k' then
    local i, used = string.match(value, '^(%d+):(%d+)')
    i = tonumber(i)
    if i > index then
      return tonumber(used), 0, i
    end
    return math.max(tonumber(used) - limit * (index - i), 0), 0
  end
  local i, c, p = string.match(value, '^(%d+):(%d+):(%d+)')
  i = tonumber(i)
  local cur, prev = tonumber(c), tonumber(p)
  if i >= index then
    return cur, prev, (i > index) and i or nil
  elseif index - i == 1 then
    return 0, cur
  end
  return 0, 0
end

-- Writes a fixed or sliding window's state, expiring when it is worthless (`reset`);
-- returns what the key now holds (false if deleted).
-- A calendar window's key (`cal_end`: its end in µs) expires at the window's end on the
-- script's clock (`now`): PX = end - now, the instant PEXPIREAT would name with Redis
-- `TIME`, and the caller's end with caller time. A write at or after the end writes
-- nothing: it cannot outlive its window.
local function win_write(code, key, index, a, b, reset, cal_end, now)
  if (a == 0 and b == 0) or (cal_end and cal_end <= now) then
    redis.call('DEL', key)
    return false
  end
  local value
  if code == 'f' or code == 'k' then
    value = string.format('%d:%d', index, a)
  else
    value = string.format('%d:%d:%d', index, a, b)
  end
  if cal_end then
    redis.call('SET', key, value, 'PX', idiv(cal_end - now + 999, 1000))
    return value
  end
  -- (a millisecond more or less of life changes nothing: the state is worthless then)
  redis.call('SET', key, value, 'PX', math.floor((reset + 999) / 1000) + 1)
  return value
end

--[[
In-flight limits (kind "c:<retry>:<members>", len = the deadline D in µs, limit = n): a
sorted set per key, one member per admitted request, "<instance>:<seq>:<units>", scored by
the instant (µs) its units stop counting. A check removes the members past their deadline
and admits if the units of the others plus its own fit, adding its member with the score
now + D; a refund removes the members it names; "hold" (a renewal) moves the members it
names to now + D if they are still there ("+" before the list: adds them back, after a
state loss). An instance that dies stops renewing: its members expire within D; a release
lost with a failed call, or a grant whose answer never came, expires the same way.
]]

-- The kind's retry (µs) and member list.
local function held_kind(kind)
  local _, _, retry, members = string.find(kind, '^c:(%d+):(.*)$')
  return tonumber(retry) or 0, members or ''
end

-- Drops the members past their deadline; the units of the others.
local function held_total(key, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local total = 0
  for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    local _, _, units = string.find(m, ':(%d+)$')
    total = total + (tonumber(units) or 1)
  end
  return total
end

-- Adds (or moves) `member` to the deadline `at`; the key lives until its last deadline.
local function held_add(key, member, at, now, xx)
  if xx then
    redis.call('ZADD', key, 'XX', at, member)
  else
    redis.call('ZADD', key, at, member)
  end
  local ms = idiv(at - now + 999, 1000) + 1
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

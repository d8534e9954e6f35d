--[[
tollgate: one operation other than a check on GCRA buckets, atomically.

KEYS[i]  a bucket: its value is the TAT in microseconds since the Unix epoch; an absent key
         is a full bucket.

ARGV[1]  now, in microseconds since the Unix epoch, or "" to use Redis TIME
ARGV[2]  the operation: "refund", "penalize", "block", "restore", "reset" or "undo" (windows only:
         give back a consumption made at the kind's `at`, for Redis Cluster), "hold"
         (in-flight limits only: this instance holds `amount` units, until now + D), or
         "once" (penalize, once per marker: see below)
Then four arguments per bucket (ARGV[4i-1] ... ARGV[4i+2]); the buckets are the first
(#ARGV - 2) / 4 keys:
  t        emission interval in microseconds (>= 1); a window limit: the window (µs)
  burst    bucket capacity in tokens (>= 1); a window limit: its limit
  amount   refund, penalize, undo: tokens; block, restore: microseconds; reset: unused
  kind     "" for GCRA; a window limit's kind (window.lua)

  refund    TAT := max(now, TAT - amount * t): never beyond a full bucket; an absent key
            stays absent (a full bucket is deleted)
  penalize  TAT := max(TAT, now) + amount * t, without bound (debt)
  block     TAT := max(TAT, now + amount + burst * t - t): a request of cost 1 is refused
            until now + amount
  restore   TAT := max(TAT, now + amount): at least as spent as a bucket full again in
            `amount` (a write-back after a state loss); window limits are unchanged
  reset     the key is deleted: a full bucket, unblocked
  once      KEYS[n + i] is bucket i's marker (n buckets, in the bucket's hash slot): if it
            exists, nothing changes (the bucket is reported as it stands); otherwise
            penalize, and the marker is written for ONCE_MS (a charge sent again after
            its answer was lost is applied once)

A written key expires when its bucket is full again (PX = TAT - now in milliseconds,
rounded up, + 1), as gcra.lua's keys do.

A TAT is at most 2^53 - 1 microseconds (the year 2255): Lua numbers are doubles, and a
larger one (a block for Duration::MAX, a huge penalty) would be written and answered
inexactly, as a float the client cannot read. Capped there, it is still "for good".

Window limits (window.lua): refund gives back up to `amount` units (fixed: of the current
window's use; sliding window: of the current window's count; sliding log: the newest
units); undo gives back exactly what a check at `at` took (fixed: as refund; sliding
window: from the window it went into, if it is the current or the previous one; sliding
log: the units at `at`); penalize (fixed: use += amount, up to 2^32 - 1) and block (fixed:
every window that [now, now + amount) touches is full) apply to fixed windows only and
change nothing in the sliding ones; reset deletes.

Reply: now, then per key: GCRA, the TAT afterwards (0: absent); a window limit, three
integers: remaining, reset_after, next_after (0: none) afterwards.
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
-- How long a "once" marker lives: PENALIZE_ONCE_FOR (src/store/mod.rs).
local ONCE_MS = 120000
local n = (#ARGV - 2) / 4
local once = op == 'once'

local MAX_USED = 4294967295

-- One operation on a window limit's key; appends its report to `reply`.
local function window_op(reply, key, len, limit, amount, kind)
  if string.sub(kind, 1, 1) == 'c' then
    -- an in-flight limit: refund/undo remove the members named, hold moves them to
    -- now + D (adds them back after "+"), reset deletes every member
    local _, members = held_kind(kind)
    if op == 'reset' then
      redis.call('DEL', key)
    elseif op == 'refund' or op == 'undo' or op == 'hold' then
      local add = string.sub(members, 1, 1) == '+'
      if add then
        members = string.sub(members, 2)
      end
      for m in string.gmatch(members, '[^,]+') do
        if op == 'hold' then
          held_add(key, m, now + len, now, not add)
        else
          redis.call('ZREM', key, m)
        end
      end
    end
    local total = 0
    if op ~= 'reset' then
      total = held_total(key, now)
    end
    reply[#reply + 1] = math.max(limit - total, 0)
    reply[#reply + 1] = 0
    reply[#reply + 1] = 0
    return
  end
  local code, phase, at = win_kind(kind)
  if op == 'reset' then
    redis.call('DEL', key)
    reply[#reply + 1] = limit
    reply[#reply + 1] = 0
    reply[#reply + 1] = 0
    return
  end
  local value = redis.call('GET', key)
  if code == 'l' then
    local ts, ns, used = log_read(value, len, now)
    if value and (op == 'refund' or op == 'undo') then
      local left = amount
      for j = #ts, 1, -1 do
        if left > 0 and (op == 'refund' or ts[j] == at) then
          local take = math.min(left, ns[j])
          ns[j] = ns[j] - take
          left = left - take
          used = used - take
        end
      end
      local kt, kn = {}, {}
      for j = 1, #ts do
        if ns[j] > 0 then
          kt[#kt + 1] = ts[j]
          kn[#kn + 1] = ns[j]
        end
      end
      ts, ns = kt, kn
      log_write(key, ts, ns, len, now)
    end
    local rem, rst, nxt = log_report(limit, len, ts, used, now)
    reply[#reply + 1] = rem
    reply[#reply + 1] = rst
    reply[#reply + 1] = nxt
    return
  end
  local fixed = code == 'f' or code == 'k'
  if not fixed then
    phase = 0
  end
  local index, e, until_end = win_at(len, phase, cal_now(code, phase, len, now))
  local cur, prev, later = win_read(code, value, limit, index)
  if later then
    index, e, until_end = later, 0, len
  end
  local changed = false
  if code == 'k' then
    -- a calendar window carries no debt: at most its whole limit is used
    if (op == 'refund' or op == 'undo') and value then
      cur = math.max(cur - amount, 0)
      changed = true
    elseif op == 'penalize' then
      cur = math.max(cur, math.min(cur + amount, limit))
      changed = true
    elseif op == 'block' and amount > 0 then
      cur = math.max(cur, limit)
      changed = true
    end
  elseif code == 'f' then
    if (op == 'refund' or op == 'undo') and value then
      cur = math.max(cur - amount, 0)
      changed = true
    elseif op == 'penalize' then
      cur = math.min(cur + amount, MAX_USED)
      changed = true
    elseif op == 'block' and amount > 0 then
      local last = idiv(math.max(now + amount - 1 - phase, 0), len)
      cur = math.max(cur, math.min(limit * (last - index + 1), MAX_USED))
      changed = true
    end
  elseif value then
    if op == 'refund' then
      cur = math.max(cur - amount, 0)
      changed = true
    elseif op == 'undo' then
      local k = index - win_at(len, 0, at)
      if k == 0 then
        cur = math.max(cur - amount, 0)
      elseif k == 1 then
        prev = math.max(prev - amount, 0)
      end
      changed = true
    end
  end
  local rem, rst, nxt
  if fixed then
    rem, rst, nxt = fixed_report(limit, len, cur, until_end)
  else
    rem, rst, nxt = sliding_report(limit, len, cur, prev, e)
  end
  if changed then
    local cal_end = nil
    if code == 'k' then
      cal_end = phase + len
    end
    win_write(code, key, index, cur, prev, rst, cal_end, now)
  end
  reply[#reply + 1] = rem
  reply[#reply + 1] = rst
  reply[#reply + 1] = nxt
end

local reply = { now }
for i = 1, n do
  local key = KEYS[i]
  local marker = nil
  if once then
    -- "seen": the charge was applied before; report the bucket, change nothing
    marker = KEYS[n + i]
    if redis.call('EXISTS', marker) == 1 then
      op = 'seen'
      marker = nil
    else
      op = 'penalize'
    end
  end
  local a = 4 * i - 1
  local t = tonumber(ARGV[a])
  local burst = tonumber(ARGV[a + 1])
  local amount = tonumber(ARGV[a + 2])
  local kind = ARGV[a + 3]
  if kind ~= '' then
    window_op(reply, key, t, burst, amount, kind)
  else
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
  elseif op == 'restore' then
    new = math.max(tat or 0, now + amount)
  elseif op == 'seen' then
    new = tat or 0
  else
    return redis.error_reply('tollgate ops.lua: unknown operation ' .. tostring(op))
  end
  if new > MAX_TAT then
    new = MAX_TAT
  end
  if op ~= 'reset' and op ~= 'seen' then
    if new > now then
      redis.call('SET', key, new, 'PX', math.floor((new - now + 999) / 1000) + 1)
    elseif tat ~= nil then
      redis.call('DEL', key)
      new = 0
    end
  end
  reply[#reply + 1] = new
  end
  if marker then
    redis.call('SET', marker, '1', 'PX', ONCE_MS)
  end
end
return reply

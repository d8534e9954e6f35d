--[[
tollgate: what a region's mover does in its region's Redis (a limit across regions), each
call atomic.

ARGV[1]  now, in microseconds since the Unix epoch, or "" to use Redis TIME
ARGV[2]  the operation:

  debit   KEYS[1] a GCRA bucket (TAT in µs; absent: full), KEYS[2] the transfer's record,
          KEYS[3] the region's outstanding transfer (a hash); ARGV[3] t (µs), ARGV[4]
          burst, ARGV[5] most, ARGV[6] keep, ARGV[7] the record's life (ms), ARGV[8] the
          transfer's id, ARGV[9] its limit, ARGV[10] its bucket key, ARGV[11] its
          destination. With a record already there, takes nothing and replies the amount
          recorded. With another transfer outstanding, takes nothing, records nothing and
          replies 0. Else takes min(most, remaining - keep) tokens (TAT += taken * t),
          records the amount under KEYS[2] and, if not 0, the transfer under KEYS[3] (for
          the record's life). Reply: the amount recorded.
  settle  KEYS[1] the region's outstanding transfer; ARGV[3] an id. Clears it if it is
          that id. Reply: 1 cleared, 0 not.
  credit  KEYS[1] a bucket, KEYS[2] the transfer's record; ARGV[3] t, ARGV[4] burst,
          ARGV[5] amount, ARGV[7] the record's life (ms). Gives `amount` tokens back,
          never beyond a full bucket (TAT := max(now, TAT - amount * t)), once: with a
          record already there, nothing. Reply: 1 applied now, 0 already.
  lead    KEYS[1] the region's lock; ARGV[3] the holder, ARGV[4] its life (ms). Taken if
          free (SET NX PX) or renewed if the holder's. Reply: 1 leads, 0 not.
  look    KEYS[i] buckets. Reply: now, then each bucket's TAT (0: absent, a full bucket).

A written bucket expires when it is full again (PX = TAT - now in ms, rounded up, + 1), as
gcra.lua's keys do.
]]

local now
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[1])
end
local op = ARGV[2]

local function write(key, tat)
  if tat > now then
    redis.call('SET', key, tat, 'PX', math.floor((tat - now + 999) / 1000) + 1)
  else
    redis.call('DEL', key)
  end
end

if op == 'lead' then
  if redis.call('SET', KEYS[1], ARGV[3], 'NX', 'PX', ARGV[4]) then
    return 1
  end
  if redis.call('GET', KEYS[1]) == ARGV[3] then
    redis.call('PEXPIRE', KEYS[1], ARGV[4])
    return 1
  end
  return 0
end

if op == 'look' then
  local reply = { now }
  for i = 1, #KEYS do
    reply[#reply + 1] = tonumber(redis.call('GET', KEYS[i]) or 0)
  end
  return reply
end

if op == 'settle' then
  if redis.call('HGET', KEYS[1], 'id') == ARGV[3] then
    redis.call('DEL', KEYS[1])
    return 1
  end
  return 0
end

local record = redis.call('GET', KEYS[2])
if op == 'debit' then
  if record then
    return tonumber(record)
  end
  if redis.call('EXISTS', KEYS[3]) == 1 then
    return 0
  end
  local t, burst = tonumber(ARGV[3]), tonumber(ARGV[4])
  local most, keep = tonumber(ARGV[5]), tonumber(ARGV[6])
  local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or 0), now)
  local remaining = math.floor((now + burst * t - tat) / t)
  remaining = math.max(0, math.min(burst, remaining))
  local take = math.max(0, math.min(most, remaining - keep))
  if take > 0 then
    write(KEYS[1], tat + take * t)
  end
  redis.call('SET', KEYS[2], take, 'PX', ARGV[7])
  if take > 0 then
    redis.call('HSET', KEYS[3], 'id', ARGV[8], 'table', ARGV[9], 'key', ARGV[10],
      'to', ARGV[11], 'amount', take)
    redis.call('PEXPIRE', KEYS[3], ARGV[7])
  end
  return take
elseif op == 'credit' then
  if record then
    return 0
  end
  local t, amount = tonumber(ARGV[3]), tonumber(ARGV[5])
  local tat = redis.call('GET', KEYS[1])
  if tat then
    write(KEYS[1], math.max(now, tonumber(tat) - amount * t))
  end
  redis.call('SET', KEYS[2], 'c', 'PX', ARGV[7])
  return 1
end
return redis.error_reply('tollgate regions.lua: unknown operation ' .. tostring(op))

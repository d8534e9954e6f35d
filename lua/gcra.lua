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
Then five arguments per limit, in KEYS order (ARGV[5i-3] ... ARGV[5i+1]):
  t        emission interval in microseconds (>= 1); a window limit: the window (µs)
  burst    bucket capacity in tokens (>= 1); a window limit: its limit
  cost     tokens this request takes (0 looks without consuming)
  enforce  1 if the limit may refuse the request, 0 for a shadow limit
  kind     "" for GCRA; a window limit's kind (window.lua)

Reply: an array of integers:
  now            the time used, in microseconds
  then, per GCRA limit, in KEYS order, three:
  verdict        0 allowed, 1 denied, 2 never (cost > burst)
  reset_after    microseconds until the bucket is full again, after this request
  previous       the TAT read (0 if absent), to undo a write exactly if needed
  and per window limit eight: verdict, retry_after (0 unless denied), then remaining,
  reset_after and next_after (0: none) after this request, then the same three for the
  key as it stood (what a request refused elsewhere reports)

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
local verdicts, afters, writes, wins = {}, {}, {}, {}
local refused = false

for i = 1, n do
  local a = 5 * i - 3
  local t = tonumber(ARGV[a])
  local burst = tonumber(ARGV[a + 1])
  local cost = tonumber(ARGV[a + 2])
  local kind = ARGV[a + 4]
  local verdict = 0
  if kind == '' then
    local tat = tonumber(tats[i]) or 0
    tats[i] = tat
    local base = now
    if tat > now then
      base = tat
    end
    local after = base
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
    afters[i] = after
  else
    local code, phase = win_kind(kind)
    local len, limit = t, burst
    -- (every field at once: one allocation, no rehash)
    local w = { code = code, retry = 0, rem = 0, rst = 0, nxt = 0, urem = 0, urst = 0,
      unxt = 0, index = 0, cur = 0, prev = 0, ts = false, ns = false, len = 0 }
    local retry = 0
    if code == 'l' then
      local ts, ns, used = log_read(tats[i], len, now)
      w.urem, w.urst, w.unxt = log_report(limit, len, ts, used, now)
      if cost > limit then
        verdict = 2
      elseif cost == 0 or used + cost <= limit then
        if cost > 0 then
          if ts[#ts] == now then
            ns[#ns] = ns[#ns] + cost
          else
            ts[#ts + 1] = now
            ns[#ns + 1] = cost
          end
          used = used + cost
          writes[i] = true
        end
      else
        verdict = 1
        retry = log_wait(limit, len, ts, ns, used, cost, now)
      end
      w.rem, w.rst, w.nxt = log_report(limit, len, ts, used, now)
      w.ts, w.ns, w.len = ts, ns, len
    else
      if code ~= 'f' then
        phase = 0
      end
      local index, e, until_end = win_at(len, phase, now)
      local cur, prev = win_read(code, tats[i], limit, index)
      local fixed = code == 'f'
      local fits
      if fixed then
        w.urem, w.urst, w.unxt = fixed_report(limit, len, cur, until_end)
        fits = cur + cost <= limit
      else
        w.urem, w.urst, w.unxt = sliding_report(limit, len, cur, prev, e)
        fits = sliding_fits(limit, len, cur, prev, e, cost)
      end
      if cost > limit then
        verdict = 2
      elseif cost == 0 or fits then
        if cost > 0 then
          cur = cur + cost
          writes[i] = true
        end
      else
        verdict = 1
        if code == 'f' then
          retry = fixed_wait(limit, len, cur, until_end, cost)
        else
          retry = sliding_wait(limit, len, cur, prev, e, cost)
        end
      end
      if not writes[i] then
        w.rem, w.rst, w.nxt = w.urem, w.urst, w.unxt
      elseif fixed then
        w.rem, w.rst, w.nxt = fixed_report(limit, len, cur, until_end)
      else
        w.rem, w.rst, w.nxt = sliding_report(limit, len, cur, prev, e)
      end
      w.index, w.cur, w.prev = index, cur, prev
    end
    w.retry = retry
    wins[i] = w
  end
  if verdict ~= 0 and ARGV[a + 3] == '1' then
    refused = true
  end
  verdicts[i] = verdict
end

local reply = { now }
for i = 1, n do
  local w = wins[i]
  if w == nil then
    local after = afters[i]
    if refused then
      if verdicts[i] == 0 then
        -- nothing is consumed: report the bucket as it stands
        after = math.max(tats[i], now)
      end
    elseif writes[i] then
      local v = writes[i]
      redis.call('SET', KEYS[i], v, 'PX', math.floor((v - now + 999) / 1000) + 1)
    end
    reply[#reply + 1] = verdicts[i]
    reply[#reply + 1] = after - now
    reply[#reply + 1] = tats[i]
  else
    if writes[i] and not refused then
      if w.code == 'l' then
        log_write(KEYS[i], w.ts, w.ns, w.len, now)
      else
        win_write(w.code, KEYS[i], w.index, w.cur, w.prev, w.rst)
      end
    end
    reply[#reply + 1] = verdicts[i]
    reply[#reply + 1] = w.retry
    if refused then
      w.rem, w.rst, w.nxt = w.urem, w.urst, w.unxt
    end
    reply[#reply + 1] = w.rem
    reply[#reply + 1] = w.rst
    reply[#reply + 1] = w.nxt
    reply[#reply + 1] = w.urem
    reply[#reply + 1] = w.urst
    reply[#reply + 1] = w.unxt
  end
end
return reply

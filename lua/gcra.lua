--[[
tollgate: GCRA (and the windows) for every limit of one request, all or nothing, for a
batch of requests decided one after the other.

The decision of `src/gcra.rs` (`gcra::decide`), in integer microseconds: every value stays
below 2^53, so Lua's doubles hold it exactly. The client derives what it tells clients
(tokens left, time to the next token, time until a refused request would pass) from the
reply with the same formulas the memory store uses, so both stores report alike; a
conformance suite runs both over the same cases.

KEYS     the buckets of every limit of every request of the batch, request after request.
         A GCRA bucket's value is the theoretical arrival time (TAT) in microseconds
         since the Unix epoch; an absent key is a full bucket.

ARGV[1]  now, in microseconds since the Unix epoch, or "" to use Redis TIME (one clock for
         every app instance, read once per batch).
Then per request, or per group of requests ("g", then `group` below: several requests of
the same plain GCRA limits, coalesced by the client): n, its number of limits (its next n KEYS), and five arguments per limit:
  t        emission interval in microseconds (>= 1); a window limit: the window (µs)
  burst    bucket capacity in tokens (>= 1); a window limit: its limit
  cost     tokens this request takes (0 looks without consuming)
  enforce  1 if the limit may refuse the request, 0 for a shadow limit; followed by
           ":<max_wait>" for a reservation: the limit also passes when
           its tokens are there within max_wait microseconds (GCRA: new_tat - now <=
           tau + max_wait; fixed window: the window where the units fit starts within
           max_wait), taking them now; the bucket goes into debt.
           A settle (GCRA only, never refuses): "d:<max_debt>" takes `cost` tokens
           into debt of at most max_debt microseconds (TAT := max(TAT, min(max(TAT, now)
           + cost * t, now + burst * t + max_debt, 2^53 - 1)), `gcra::debit`; a limit
           without a debt cap sends 2^53 - 1); "c" gives `cost`
           back, never beyond a full bucket (TAT := max(now, TAT - cost * t); an absent
           key stays absent)
  kind     "" for GCRA; a window limit's kind (window.lua)

Reply: an array of integers:
  now            the time used, in microseconds
  then, request after request, per GCRA limit, in KEYS order, three:
  verdict        0 allowed, 1 denied, 2 never (cost > burst)
  reset_after    microseconds until the bucket is full again, after this request
  previous       the TAT read (0 if absent), to undo a write exactly if needed
  and per window limit five: verdict, retry_after (0 unless denied), then the state after
  this request (as the key stands if the request is refused), from which the client
  derives what it tells clients with `src/window.rs`, as the memory store does:
    fixed window    used, time to the window's end, the units this request added to the
                    use (its cost; more for a reservation that skips what is left of
                    the current window: what an undo gives back)
    sliding window  current count, previous count, time into the current window
    sliding log     remaining, reset_after, next_after (0: none)
  (a request refused by another slot of a cluster learns the state from ops.lua's
  "undo", which gives its units back)

Each request is decided on its own, after the writes of the requests before it in the
batch (as if each were its own call, in that order): it proceeds only if none of its
enforcing limits is denied or never. Only then are the
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

-- Every key of the batch in one MGET; `fresh` holds what this batch wrote since (false:
-- deleted), so a key met again in a later request is read as it now stands.
local read = #KEYS > 0 and redis.call('MGET', unpack(KEYS)) or {}
local fresh = {}

-- Decides one request: its limits are KEYS[k0 + 1 .. k0 + n], their arguments start at
-- ARGV[a0]; appends its answers to `reply` and writes its keys if it proceeds.
-- Scratch tables, reused by every request: each entry is set before it is read. (A fresh
-- set of tables per request was a fifth of the script's time per decision: the garbage.)
local tats, verdicts, afters, writes, wins = {}, {}, {}, {}, {}
local reply, nreply = { now }, 1
local function decide(k0, a0, n)
  for i = 1, n do
    local v = fresh[KEYS[k0 + i]]
    if v == nil then
      v = read[k0 + i]
    end
    tats[i] = v
    writes[i] = false
    wins[i] = false
  end
  local refused = false

  for i = 1, n do
    local a = a0 + 5 * (i - 1)
    local t = tonumber(ARGV[a])
    local burst = tonumber(ARGV[a + 1])
    local cost = tonumber(ARGV[a + 2])
    local kind = ARGV[a + 4]
    local enforce = ARGV[a + 3]
    local max_wait = 0
    if #enforce > 1 then
      max_wait = tonumber(string.sub(enforce, 3))
      enforce = string.sub(enforce, 1, 1)
    end
    local verdict = 0
    if enforce == 'd' or enforce == 'c' then
      -- a settle: never refuses, never checks the burst
      local tat = tonumber(tats[i]) or 0
      tats[i] = tat
      local after = math.max(tat, now)
      if kind ~= '' then
        after = now -- window limits are unchanged (the client never sends them here)
      elseif enforce == 'd' then
        -- at most 2^53 - 1, the last exact double: a settle without a debt cap sends
        -- d:<2^53 - 1>, and the TAT must stay an integer both sides read alike
        local cap = math.min(now + burst * t + max_wait, 9007199254740991)
        local new_tat = math.max(tat, math.min(after + cost * t, cap))
        if new_tat > tat then
          writes[i] = new_tat
          after = new_tat
        end
      elseif tat > 0 and cost > 0 then
        after = math.max(now, tat - cost * t)
        writes[i] = after
      end
      afters[i] = after
    elseif kind == '' then
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
        -- a peek (cost 0) is allowed even on a bucket in debt, and writes nothing
        if cost == 0 or new_tat - now <= burst * t + max_wait then
          after = new_tat
          if cost > 0 then
            writes[i] = new_tat
          end
        else
          verdict = 1
        end
      end
      afters[i] = after
    elseif string.sub(kind, 1, 1) == 'c' then
      -- an in-flight limit (window.lua): t is the deadline, burst the limit; its sorted
      -- set is read here, not by the MGET
      local retry_us, member = held_kind(kind)
      local total = held_total(KEYS[k0 + i], now)
      local before = math.max(burst - total, 0)
      local left = before
      local retry = 0
      if cost > burst then
        verdict = 2
      elseif cost == 0 or total + cost <= burst then
        if cost > 0 then
          writes[i] = true
          left = burst - total - cost
        end
      else
        verdict = 1
        retry = math.max(retry_us, 1)
      end
      wins[i] = { 'c', retry, left, 0, 0, member, t, 0, before }
    else
      local code, phase = kind, 0
      if #kind > 1 then
        code, phase = win_kind(kind)
      end
      local len, limit = t, burst
      local retry = 0
      -- One positional table per window limit: code, retry, the report after the request
      -- (3), what to write (3), and what recomputes the report as the key stood (4).
      if code == 'l' then
        local ts, ns, used = log_read(tats[i], len, now)
        local urem, urst, unxt = log_report(limit, len, ts, used, now)
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
        local rem, rst, nxt = log_report(limit, len, ts, used, now)
        wins[i] = { code, retry, rem, rst, nxt, ts, ns, len, urem, urst, unxt }
      else
        local fixed = code == 'f' or code == 'k'
        if not fixed then
          phase = 0
        end
        local index, e, until_end = win_at(len, phase, cal_now(code, phase, len, now))
        local cur, prev, later = win_read(code, tats[i], limit, index)
        if later then
          index, e, until_end = later, 0, len
        end
        local before = cur
        local fits
        local reserved_at = 0
        if fixed then
          fits = cur + cost <= limit
          if not fits and max_wait > 0 and cost <= limit then
            -- a reservation: its units start together in the first window k where they
            -- fit, and what is left of the windows before k counts as used
            -- (src/window.rs, fixed_reservation); refused if the use would not fit in 32
            -- bits (FIXED_MAX_USE)
            local k = math.max(idiv(cur + cost - 1, limit), 1)
            if until_end + (k - 1) * len <= max_wait then
              reserved_at = k * limit
              fits = math.max(cur, reserved_at) + cost <= 4294967295
            end
          end
        else
          fits = sliding_fits(limit, len, cur, prev, e, cost)
        end
        if cost > limit then
          verdict = 2
        elseif cost == 0 or fits then
          if cost > 0 then
            cur = math.max(cur, reserved_at) + cost
            writes[i] = true
          end
        else
          verdict = 1
          if fixed then
            retry = fixed_wait(limit, len, cur, until_end, cost)
          else
            retry = sliding_wait(limit, len, cur, prev, e, cost)
          end
        end
        if fixed then
          -- a reservation's debt: the key lives until the last window it reaches ends
          local debt_px = nil
          if cur > limit then
            debt_px = until_end + (idiv(cur + limit - 1, limit) - 1) * len
          end
          local cal_end = nil
          if code == 'k' then
            cal_end = phase + len
          end
          wins[i] = { code, retry, cur, until_end, cur - before, index, cur, 0, cur - before, len, debt_px, cal_end }
        else
          wins[i] = { code, retry, cur, prev, e, index, cur, prev, cur - before, len }
        end
      end
    end
    if verdict ~= 0 and enforce == '1' then
      refused = true
    end
    verdicts[i] = verdict
  end

  for i = 1, n do
    local w = wins[i]
    if not w then
      local after = afters[i]
      if refused then
        if verdicts[i] == 0 then
          -- nothing is consumed: report the bucket as it stands
          after = math.max(tats[i], now)
        end
      elseif writes[i] then
        local v = writes[i]
        redis.call('SET', KEYS[k0 + i], v, 'PX', math.floor((v - now + 999) / 1000) + 1)
        fresh[KEYS[k0 + i]] = v
      end
      reply[nreply + 1] = verdicts[i]
      reply[nreply + 2] = after - now
      reply[nreply + 3] = tats[i]
      nreply = nreply + 3
    else
      local written = writes[i]
      if written and not refused then
        if w[1] == 'l' then
          fresh[KEYS[k0 + i]] = log_write(KEYS[k0 + i], w[6], w[7], w[8], now)
        elseif w[1] == 'c' then
          held_add(KEYS[k0 + i], w[6], now + w[7], now, false)
        else
          -- expires when worthless: the window's end (fixed; or the end of the last
          -- window a reservation's debt reaches), or the next window's end (sliding)
          local px = w[4]
          if w[1] == 's' then
            px = 2 * w[10] - w[5]
          elseif w[11] then
            px = w[11]
          end
          fresh[KEYS[k0 + i]] = win_write(w[1], KEYS[k0 + i], w[6], w[7], w[8], px, w[12], now)
        end
      end
      local r = nreply
      nreply = r + 5
      reply[r + 1] = verdicts[i]
      reply[r + 2] = w[2]
      if refused and written then
        -- nothing is consumed: report the key as it stands
        if w[1] == 'l' then
          reply[r + 3], reply[r + 4], reply[r + 5] = w[9], w[10], w[11]
        elseif w[1] == 'c' then
          reply[r + 3], reply[r + 4], reply[r + 5] = w[9], 0, 0
        else
          reply[r + 3], reply[r + 4], reply[r + 5] = w[3] - w[9], w[4], w[5]
        end
      else
        reply[r + 3], reply[r + 4], reply[r + 5] = w[3], w[4], w[5]
      end
    end
  end
end

-- Decides a group: m requests of the same n GCRA limits (KEYS[k0 + 1 .. k0 + n], each
-- once), one after the other, as `decide` would decide each, with one read and at most one
-- SET per key for all m (the last value `decide` would write, with its expiry). Arguments
-- from ARGV[a0], four per limit: t, burst, enforce ("1" or "0"), and the members' costs:
-- one integer for all, or m integers separated by commas. Replies the number of requests
-- that proceeded, then per limit the TAT read (0 if absent) and the TAT after the group;
-- the client replays the m decisions from these (batch.rs) and checks it ends where the
-- script did.
local gt, gb, ge, gc, gtat, gstart, gw, gcost, gok = {}, {}, {}, {}, {}, {}, {}, {}, {}
local function group(k0, a0, m, n)
  for i = 1, n do
    local v = fresh[KEYS[k0 + i]]
    if v == nil then
      v = read[k0 + i]
    end
    local tat = tonumber(v) or 0
    gtat[i], gstart[i], gw[i] = tat, tat, false
    local a = a0 + 4 * (i - 1)
    gt[i] = tonumber(ARGV[a])
    gb[i] = tonumber(ARGV[a + 1])
    ge[i] = ARGV[a + 2] == '1'
    local costs = ARGV[a + 3]
    local one = tonumber(costs)
    if one then
      gc[i] = one
    else
      local list, j = {}, 0
      for c in string.gmatch(costs, '%d+') do
        j = j + 1
        list[j] = tonumber(c)
      end
      gc[i] = list
    end
  end
  local proceeded = 0
  for j = 1, m do
    local refused = false
    for i = 1, n do
      local cost = gc[i]
      if type(cost) == 'table' then
        cost = cost[j]
      end
      gcost[i] = cost
      local base = now
      if gtat[i] > now then
        base = gtat[i]
      end
      -- as `decide`: never (cost > burst) and denied refuse when enforced; a peek passes
      local ok = cost <= gb[i] and (cost == 0 or base + cost * gt[i] - now <= gb[i] * gt[i])
      gok[i] = ok
      if not ok and ge[i] then
        refused = true
      end
    end
    if not refused then
      proceeded = proceeded + 1
      for i = 1, n do
        local cost = gcost[i]
        if gok[i] and cost > 0 then
          local base = now
          if gtat[i] > now then
            base = gtat[i]
          end
          gtat[i] = base + cost * gt[i]
          gw[i] = true
        end
      end
    end
  end
  reply[nreply + 1] = proceeded
  nreply = nreply + 1
  for i = 1, n do
    local v = gtat[i]
    if gw[i] then
      redis.call('SET', KEYS[k0 + i], v, 'PX', math.floor((v - now + 999) / 1000) + 1)
      fresh[KEYS[k0 + i]] = v
    end
    reply[nreply + 1] = gstart[i]
    reply[nreply + 2] = v
    nreply = nreply + 2
  end
end

local k0, a, nargs = 0, 2, #ARGV
while a <= nargs do
  if ARGV[a] == 'g' then
    local m, n = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    group(k0, a + 3, m, n)
    k0 = k0 + n
    a = a + 3 + 4 * n
  else
    local n = tonumber(ARGV[a])
    decide(k0, a + 1, n)
    k0 = k0 + n
    a = a + 1 + 5 * n
  end
end
return reply

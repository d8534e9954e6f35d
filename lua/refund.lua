--[[
tollgate: give back what a request consumed when another part of it was refused.

Redis Cluster only: limits whose keys live in different hash slots are checked by separate
calls of gcra.lua, one per slot. When one call consumed and another refused, this script
undoes the consumption, so that a refused request takes nothing from any limit.

KEYS[i]  a bucket the request consumed from
ARGV[1]  now in microseconds since the Unix epoch, or "" to use Redis TIME
Then three arguments per key (ARGV[2 + 3(i-1)] ...):
  written    the TAT the request wrote (gcra.lua's `written`)
  previous   the TAT it replaced (gcra.lua's `previous`)
  cost_time  the cost of the request times the emission interval, in microseconds

If the bucket still holds exactly `written`, nobody touched it since: `previous` is
restored. Otherwise other requests moved it on; the part of this request's consumption the
TAT can still hold, min(cost_time, written - now), is taken back, which never gives more
than the bucket would have had without the request (see `gcra::refund_amount`).

Reply: the number of buckets changed.
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

local now
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[1])
end

local changed = 0
for i = 1, #KEYS do
  local a = 2 + 3 * (i - 1)
  local written = tonumber(ARGV[a])
  local previous = tonumber(ARGV[a + 1])
  local cost_time = tonumber(ARGV[a + 2])
  local current = tonumber(redis.call('GET', KEYS[i]))
  if current then
    local target
    if current == written then
      target = previous
    else
      target = current - math.min(cost_time, math.max(0, written - now))
    end
    if target <= now then
      redis.call('DEL', KEYS[i])
    else
      redis.call('SET', KEYS[i], target, 'PX', idiv(target - now + 999, 1000) + 1)
    end
    changed = changed + 1
  end
end
return changed

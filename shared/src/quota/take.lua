-- Admits one run against its quota counters, atomically: checks every counter, then takes room
-- in each, or in none.
-- KEYS: for each counter, its hash (`w` window start ms, `n` runs in the window, `d` UTC day
--       number, `t` tokens of that day) then its set of active runs (run id -> take time ms).
--       One hash tag (the tenant): one Cluster slot.
-- ARGV: the run id, then for each counter its runs per hour, concurrent runs and daily tokens
--       limits ('' when not set).
-- Answers {'ok'}; {'load', i, ...} when counters' hashes are missing (never made, or lost with
-- Redis: the caller rebuilds them from Postgres, then asks again); or the refusal: {code, i,
-- seconds to wait (0: unknown)}, and for `concurrency_limited` also Redis's time (ms) and the
-- oldest members of the full set with their take times, so the caller can prune runs that
-- ended.
local t = redis.call('TIME')
local secs = tonumber(t[1])
local now = secs * 1000 + math.floor(tonumber(t[2]) / 1000)
local day = math.floor(secs / 86400)
local hour = 3600000
local counters = #KEYS / 2

local missing = {'load'}
for i = 1, counters do
  if redis.call('EXISTS', KEYS[2 * i - 1]) == 0 then
    missing[#missing + 1] = i
  end
end
if #missing > 1 then
  return missing
end

local windows = {}
for i = 1, counters do
  local meta, active = KEYS[2 * i - 1], KEYS[2 * i]
  local rate, conc, budget = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local fields = redis.call('HMGET', meta, 'w', 'n', 'd', 't')
  if budget ~= '' and tonumber(fields[3]) == day
     and tonumber(fields[4]) >= tonumber(budget) then
    return {'budget_exceeded', i, (day + 1) * 86400 - secs}
  end
  if conc ~= '' and redis.call('ZCARD', active) >= tonumber(conc) then
    local answer = {'concurrency_limited', i, 0, now}
    local oldest = redis.call('ZRANGE', active, 0, 999, 'WITHSCORES')
    for j = 1, #oldest do
      answer[#answer + 1] = oldest[j]
    end
    return answer
  end
  local started = tonumber(fields[1])
  if started ~= nil and now - started >= hour then
    started = nil
  end
  if rate ~= '' and started ~= nil and tonumber(fields[2]) >= tonumber(rate) then
    return {'rate_limited', i, math.ceil((started + hour - now) / 1000)}
  end
  windows[i] = started
end

for i = 1, counters do
  local meta, active = KEYS[2 * i - 1], KEYS[2 * i]
  if ARGV[3 * i - 1] ~= '' then
    if windows[i] == nil then
      redis.call('HSET', meta, 'w', string.format('%.0f', now), 'n', 1)
    else
      redis.call('HINCRBY', meta, 'n', 1)
    end
  end
  if ARGV[3 * i] ~= '' then
    redis.call('ZADD', active, now, ARGV[1])
  end
end
return {'ok'}

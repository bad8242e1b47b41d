-- Admits one run against its quota counters, atomically: checks every counter, then takes room
-- in each, or in none.
-- KEYS: for each counter, its hash (`w` window start ms, `n` runs in the window, `d` UTC day
--       number, `t` tokens of that day, `c` dollars of that day) then its set of active runs
--       (run id -> take time ms).
--       One hash tag (the tenant): one Cluster slot.
-- ARGV: the run id, then for each counter its runs per hour, concurrent runs, daily tokens and
--       daily dollars limits ('' when not set), then how often a full set may be pruned (ms).
-- Answers {'ok', Redis's time (ms)}; {'load', i, ...} when counters' hashes are missing (never made, or lost with
-- Redis: the caller rebuilds them from Postgres, then asks again); or the refusal: {code, i,
-- seconds to wait (0: unknown)}, for `budget_exceeded` also which budget ('tokens' or 'usd'), for `concurrency_limited` also Redis's time (ms) and the
-- oldest members of the full set with their take times, so the caller can prune runs that
-- ended. A full set is offered for pruning at most once per interval (`p` in the hash: when it
-- last was); within it the refusal comes with no members, and costs Postgres nothing.
local t = redis.call('TIME')
local secs = tonumber(t[1])
local now = secs * 1000 + math.floor(tonumber(t[2]) / 1000)
local day = math.floor(secs / 86400)
local hour = 3600000
local counters = #KEYS / 2
local prune_every = tonumber(ARGV[4 * counters + 2])

-- A counter's hash always holds `d` (load.lua makes it so): without it, the counter is missing.
local missing = {'load'}
local held = {}
for i = 1, counters do
  held[i] = redis.call('HMGET', KEYS[2 * i - 1], 'w', 'n', 'd', 't', 'c')
  if not held[i][3] then
    missing[#missing + 1] = i
  end
end
if #missing > 1 then
  return missing
end

local windows = {}
local cards = {}
for i = 1, counters do
  local active = KEYS[2 * i]
  local rate, conc = ARGV[4 * i - 2], ARGV[4 * i - 1]
  local budget, dollars = ARGV[4 * i], ARGV[4 * i + 1]
  local fields = held[i]
  if budget ~= '' and tonumber(fields[3]) == day
     and tonumber(fields[4]) >= tonumber(budget) then
    return {'budget_exceeded', i, (day + 1) * 86400 - secs, 'tokens'}
  end
  -- A hash made before costs were counted has no `c`: nothing spent.
  if dollars ~= '' and tonumber(fields[3]) == day
     and (tonumber(fields[5]) or 0) >= tonumber(dollars) then
    return {'budget_exceeded', i, (day + 1) * 86400 - secs, 'usd'}
  end
  local card = 0
  if conc ~= '' then
    card = redis.call('ZCARD', active)
  end
  if conc ~= '' and card >= tonumber(conc) then
    local answer = {'concurrency_limited', i, 0, now}
    local pruned = tonumber(redis.call('HGET', KEYS[2 * i - 1], 'p'))
    if pruned ~= nil and now - pruned < prune_every then
      return answer
    end
    redis.call('HSET', KEYS[2 * i - 1], 'p', string.format('%.0f', now))
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
  cards[i] = card
end

for i = 1, counters do
  local meta, active = KEYS[2 * i - 1], KEYS[2 * i]
  if ARGV[4 * i - 2] ~= '' then
    if windows[i] == nil then
      redis.call('HSET', meta, 'w', string.format('%.0f', now), 'n', 1)
    else
      redis.call('HINCRBY', meta, 'n', 1)
    end
  end
  if ARGV[4 * i - 1] ~= '' then
    redis.call('ZADD', active, now, ARGV[1])
    if cards[i] == 0 then
      -- A set made anew (it goes when emptied) expires a minute after its hash, as load.lua
      -- makes them: the hash never stands without its set.
      local left = redis.call('PTTL', meta)
      if left > 0 then
        redis.call('PEXPIRE', active, left + 60000)
      end
    end
  end
end
return {'ok', now}

-- Copies the day's tokens and dollars of a run's counters, as Postgres counted them, into their
-- hashes, in one call: each unless its hash already holds a later day or more of both (a later
-- charge got there first). A counter Redis does not hold is left alone: it is made from Postgres when next
-- needed.
-- KEYS: the counters' hashes (one hash tag, the tenant: one Cluster slot). ARGV: for each, the
-- UTC day number, its tokens and its dollars.
-- Answers how many hashes it changed.
local changed = 0
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local fields = redis.call('HMGET', KEYS[i], 'd', 't', 'c')
    local day = tonumber(ARGV[3 * i - 2])
    local tokens, dollars = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
    local held_day, held = tonumber(fields[1]) or 0, tonumber(fields[2]) or 0
    local held_dollars = tonumber(fields[3]) or 0
    if day > held_day or (day == held_day and (tokens > held or dollars > held_dollars)) then
      redis.call('HSET', KEYS[i], 'd', ARGV[3 * i - 2], 't', ARGV[3 * i - 1], 'c', ARGV[3 * i])
      changed = changed + 1
    end
  end
end
return changed

-- Makes a quota counter from what Postgres knows, unless it exists (another process made it
-- first, and it has counted since).
-- KEYS: the counter's hash, its set of active runs.
-- ARGV: the window's start (ms, '' for none) and runs in it, the UTC day number and its
--       tokens, how long (ms) a take may stay uncommitted, the day's dollars, then the ids of the
--       counter's active runs.
-- Answers 1 when it made the counter, 0 when it existed.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'd', ARGV[3], 't', ARGV[4], 'c', ARGV[6])
if ARGV[1] ~= '' then
  redis.call('HSET', KEYS[1], 'w', ARGV[1], 'n', ARGV[2])
end
-- The set outlives its hash by a minute: what it holds from before is replaced by Postgres's
-- account, except takes recent enough to be enqueues still committing, which Postgres cannot
-- see yet (dropping them would admit past the limit).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. string.format('%.0f', now - tonumber(ARGV[5])))
local members = {}
for j = 7, #ARGV do
  members[#members + 1] = now
  members[#members + 1] = ARGV[j]
  if #members >= 1000 then
    redis.call('ZADD', KEYS[2], unpack(members))
    members = {}
  end
end
if #members > 0 then
  redis.call('ZADD', KEYS[2], unpack(members))
end
-- Made again from Postgres a day and an hour later (or when next used after that): Redis holds
-- only counters in use, and no count drifts for longer. The set expires a minute after its
-- hash, so the hash never stands without the set it counts with (take.lua does the same for a
-- set it makes anew).
redis.call('PEXPIRE', KEYS[1], 25 * 3600000)
redis.call('PEXPIRE', KEYS[2], 25 * 3600000 + 60000)
return 1

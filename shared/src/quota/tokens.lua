-- Copies a counter's tokens of the day, as Postgres counted them, into its hash, unless the
-- hash already holds a later day or more tokens (a later charge got there first). A counter
-- Redis does not hold is left alone: it is made from Postgres when next needed.
-- KEYS: the counter's hash. ARGV: the UTC day number, its tokens.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local fields = redis.call('HMGET', KEYS[1], 'd', 't')
local day, tokens = tonumber(ARGV[1]), tonumber(ARGV[2])
local held_day, held = tonumber(fields[1]) or 0, tonumber(fields[2]) or 0
if day > held_day or (day == held_day and tokens > held) then
  redis.call('HSET', KEYS[1], 'd', ARGV[1], 't', ARGV[2])
  return 1
end
return 0

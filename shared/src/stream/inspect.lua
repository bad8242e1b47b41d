-- Retention facts of a stream and a cursor in one round trip: {exists, newest trimmed entry id,
-- first id, first type, whether the cursor's entry is in the stream}.
-- KEYS: the stream, the starts hash (which records the newest trimmed entry). ARGV: the cursor.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'0'}
end
local trimmed = redis.call('HGET', KEYS[2], ':trimmed') or '0-0'
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
local first_id, first_type = '', ''
if #first > 0 then
  first_id = first[1][1]
  local fields = first[1][2]
  for i = 1, #fields, 2 do
    if fields[i] == 't' then
      first_type = fields[i + 1]
    end
  end
end
local holds = '0'
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1], 'COUNT', 1) > 0 then
  holds = '1'
end
return {'1', trimmed, first_id, first_type, holds}

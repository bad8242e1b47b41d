-- A new attempt's takeover of a workflow: raises the fence to the attempt (as publish.lua does,
-- so no earlier attempt publishes after this) and returns what the earlier attempts showed of
-- the run's step results: `{step}\n{tool_call_id}\n{tool_call_id}...` for the latest step with a
-- result in the stream, or nil when none is.
-- KEYS: fence hash. ARGV: workflow_id, attempt.
local fence = KEYS[1]
local attempt = tonumber(ARGV[2])
local current = tonumber(redis.call('HGET', fence, ARGV[1]) or '0')
if current > attempt then
  return redis.error_reply('SPOOL_FENCED ' .. current)
end
if current < attempt then
  redis.call('HSET', fence, ARGV[1], ARGV[2])
end
return redis.call('HGET', fence, ARGV[1] .. ':shown')

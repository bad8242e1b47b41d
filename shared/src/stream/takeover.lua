-- A new attempt's takeover of a workflow: raises the fence to the attempt (fence.lua, as
-- publish.lua does, so no earlier attempt publishes after this) and returns what the earlier
-- attempts showed of the run's step results: `{step}\n{tool_call_id}\n{tool_call_id}...` for
-- the latest step with a result in the stream, or nil when none is.
-- KEYS: fence hash. ARGV: workflow_id, attempt.
local fence = KEYS[1]
local fenced = raise_fence(fence, ARGV[1], tonumber(ARGV[2]))
if fenced then
  return fenced
end
return redis.call('HGET', fence, ARGV[1] .. ':shown')

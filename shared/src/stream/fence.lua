-- Shared by publish.lua and takeover.lua (each is loaded with this file in front of it).
-- Raises workflow `workflow`'s fence in hash `fence` to `attempt` (a number), unless a later
-- attempt holds it: then answers the `SPOOL_FENCED <attempt>` error the caller must return.
local function raise_fence(fence, workflow, attempt)
  local current = tonumber(redis.call('HGET', fence, workflow) or '0')
  if current > attempt then
    return redis.error_reply('SPOOL_FENCED ' .. current)
  end
  if current < attempt then
    redis.call('HSET', fence, workflow, attempt)
  end
  return nil
end

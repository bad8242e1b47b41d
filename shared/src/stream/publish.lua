-- Publishes one attempt's batch of events to a thread's stream, fenced on the attempt.
-- KEYS: stream, fence hash, starts hash (one hash tag: one Cluster slot).
-- ARGV: workflow_id, attempt, retention_ms, notify channel, thread_id, batch id, the id of the
--       attempt's previous batch that was stored ('' for its first), then (type,
--       message_id, entry) for each event, the entry being the stored field
--       `{type} {message_id} {depth} {json}`. No event: it only raises the fence to this attempt.
--       A step result's type is `step result {step}\n{tool_call_id}`: the workflow's `:shown`
--       field records it (see takeover.lua).
-- A batch whose id is among the last ones applied for the workflow was already stored (a retry
-- after a reply was lost): it is not stored again.
-- The answer: the number of events in the batch, 0 if it is empty or was already stored (their
-- entry ids are not sent back: nobody reads them, and a batch of 512 would cost a reply of 512).
-- A previous batch that is not among the last ones applied was stored and then lost (a failover
-- to a replica it had not reached yet, a restart): a `stream_gap` marker goes before this
-- batch, so whoever reads across it is told (`stream_reset`) rather than shown a silent hole.
local stream, fence, starts = KEYS[1], KEYS[2], KEYS[3]

-- Whether entry id `a` comes after entry id `b` (`<ms>-<seq>`; a missing `b` is before all).
local function after(a, b)
  local a_ms, a_seq = string.match(a, '^(%d+)-(%d+)$')
  local b_ms, b_seq = string.match(b or '0-0', '^(%d+)-(%d+)$')
  a_ms, b_ms = tonumber(a_ms), tonumber(b_ms)
  return a_ms > b_ms or (a_ms == b_ms and tonumber(a_seq) > tonumber(b_seq))
end
local fenced = raise_fence(fence, ARGV[1], tonumber(ARGV[2]))
if fenced then
  return fenced
end
local batches_field = ARGV[1] .. ':batches'
local applied = redis.call('HGET', fence, batches_field) or ''
if string.find(',' .. applied .. ',', ',' .. ARGV[6] .. ',', 1, true) then
  return 0
end
local previous = ARGV[7]
local lost = previous ~= '' and
  not string.find(',' .. applied .. ',', ',' .. previous .. ',', 1, true)
-- Remember this batch among the last 16 applied for the workflow.
local ids_kept = {}
for id in string.gmatch(applied, '[^,]+') do
  ids_kept[#ids_kept + 1] = id
end
ids_kept[#ids_kept + 1] = ARGV[6]
while #ids_kept > 16 do
  table.remove(ids_kept, 1)
end
redis.call('HSET', fence, batches_field, table.concat(ids_kept, ','))
if redis.call('EXISTS', stream) == 0 then
  -- Marks the stream's birth, so a cursor from before it (an expired or lost stream) is seen
  -- as a gap.
  redis.call('XADD', stream, '*', 't', 'stream_start')
end
if lost then
  redis.call('XADD', stream, '*', 't', 'stream_gap')
end
local retention = tonumber(ARGV[3])
local shown_field = ARGV[1] .. ':shown'
local published = 0
for i = 8, #ARGV, 3 do
  local kind, message, payload = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local id = false
  if kind == 'message_start' then
    id = redis.call('HGET', starts, message)
    -- A start at or before the newest trimmed entry went with it (its message outlived the
    -- window, say a run waiting that long on an agent call of its own): write a new one.
    if id and not after(id, redis.call('HGET', starts, ':trimmed')) then
      id = false
    end
  end
  if not id then
    id = redis.call('XADD', stream, '*', 'x', payload)
  end
  -- (Its first byte first, 115 being `s`: most events are text deltas, which skip the rest.)
  if string.byte(kind, 1) == 115 and string.sub(kind, 1, 12) == 'step result ' then
    -- What a client keeps across attempt_restarted: every event up to the last step result.
    -- The field holds the latest step with a result shown and each of its results shown.
    local step, call = string.match(kind, '^step result (%d+)\n(.*)$')
    local shown = redis.call('HGET', fence, shown_field)
    if shown and string.match(shown, '^(%d+)\n') == step then
      shown = shown .. '\n' .. call
    else
      shown = step .. '\n' .. call
    end
    redis.call('HSET', fence, shown_field, shown)
  end
  if kind == 'message_start' then
    redis.call('HSET', starts, message, id)
    redis.call('PERSIST', stream)
    redis.call('PERSIST', fence)
    redis.call('PERSIST', starts)
  elseif kind == 'done' then
    local now = redis.call('TIME')
    local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    local min_ms = now_ms - retention
    -- Forget the fences of workflows done before the window (so a long-lived thread's hash
    -- does not grow with every run): their events are trimmed, and their attempts' leases
    -- are long gone. This one's fence stays until its own done leaves the window.
    redis.call('HSET', fence, ARGV[1] .. ':done', now_ms)
    -- The run is over: no attempt takes it over again.
    redis.call('HDEL', fence, shown_field)
    -- The hash is read whole only when its oldest done (field `:oldest_done`, as of the last
    -- read) left the window more than an eighth of a window ago: a thread's hash holds every
    -- run of the window (3,000 runs on one thread made the read 4.6 ms of Redis per done), and
    -- with the slack a thread in steady use reads it eight times a window, not at every done.
    -- A fence is forgotten between one and 1.125 windows after its done.
    local oldest = tonumber(redis.call('HGET', fence, ':oldest_done') or '0')
    if oldest < min_ms - math.floor(retention / 8) then
      oldest = now_ms
      local fenced = redis.call('HGETALL', fence)
      for f = 1, #fenced, 2 do
        local workflow = string.match(fenced[f], '^(.+):done$')
        if workflow then
          local done_ms = tonumber(fenced[f + 1])
          if done_ms < min_ms then
            redis.call('HDEL', fence, workflow, workflow .. ':batches', fenced[f])
          elseif done_ms < oldest then
            oldest = done_ms
          end
        end
      end
      redis.call('HSET', fence, ':oldest_done', oldest)
    end
    local start = redis.call('HGET', starts, message)
    if start then
      local start_ms = tonumber(string.match(start, '^(%d+)'))
      if start_ms < min_ms then
        min_ms = start_ms
      end
    end
    if min_ms > 0 then
      local threshold = string.format('%d', min_ms)
      -- Remember the newest entry trimmed: a cursor before it has lost events. (Redis's own
      -- max-deleted-entry-id does not move on XTRIM.)
      -- Whether anything is to be trimmed is asked forward: a reverse read from an end below
      -- every entry (every done of a thread younger than the window) walks the whole stream
      -- in Redis 7.0 (10-14 ms at 100,000 entries), where this takes microseconds. With an
      -- entry below the end, the reverse read finds the newest one at once. The end is
      -- `(<ms>-0`, what XTRIM MINID keeps from: `(<ms>` alone would include that millisecond.
      local below = '(' .. threshold .. '-0'
      local newest_trimmed = {}
      if #redis.call('XRANGE', stream, '-', below, 'COUNT', 1) > 0 then
        newest_trimmed = redis.call('XREVRANGE', stream, below, '-', 'COUNT', 1)
      end
      if #newest_trimmed > 0 then
        redis.call('XTRIM', stream, 'MINID', threshold)
        redis.call('HSET', starts, ':trimmed', newest_trimmed[1][1])
        -- The message_starts trimmed are forgotten. In steady use every done trims, and the
        -- hash holds a field per message of the window: like the fence hash, it is read whole
        -- only when its oldest start (`:oldest_start`, as of the last read) is more than an
        -- eighth of a window before what is kept. A start may so outlive its entry by up to
        -- that eighth; a start at or before `:trimmed` is taken as gone by whoever reads it.
        local oldest_start = tonumber(redis.call('HGET', starts, ':oldest_start') or '0')
        if oldest_start < min_ms - math.floor(retention / 8) then
          oldest_start = now_ms
          local started = redis.call('HGETALL', starts)
          for f = 1, #started, 2 do
            if string.byte(started[f], 1) ~= 58 then -- `:`, the hash's own fields
              local start_ms = tonumber(string.match(started[f + 1], '^(%d+)'))
              if start_ms and start_ms < min_ms then
                redis.call('HDEL', starts, started[f])
              elseif start_ms and start_ms < oldest_start then
                oldest_start = start_ms
              end
            end
          end
          redis.call('HSET', starts, ':oldest_start', oldest_start)
        end
      end
    end
    redis.call('PEXPIRE', stream, retention)
    redis.call('PEXPIRE', fence, retention)
    redis.call('PEXPIRE', starts, retention)
  end
  published = published + 1
end
-- An empty batch only raises the fence: there is nothing to announce.
if published > 0 then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return published

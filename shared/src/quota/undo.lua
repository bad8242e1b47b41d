-- Gives back what a take took for a run that was never made (its enqueue failed): its place
-- in each counter's set of active runs, and its count in each hour window, unless that window
-- has started again since the take (then the run was never counted in it).
-- KEYS: for each counter, its hash then its set (as take.lua).
-- ARGV: the run id, the take's time (ms), then for each counter '1' when it has an hourly limit
--       and '' when not.
local taken = tonumber(ARGV[2])
for i = 1, #KEYS / 2 do
  local meta, active = KEYS[2 * i - 1], KEYS[2 * i]
  redis.call('ZREM', active, ARGV[1])
  if ARGV[2 + i] ~= '' then
    local fields = redis.call('HMGET', meta, 'w', 'n')
    local started, runs = tonumber(fields[1]), tonumber(fields[2])
    if started ~= nil and started <= taken and runs ~= nil and runs > 0 then
      redis.call('HINCRBY', meta, 'n', -1)
    end
  end
end
return 1

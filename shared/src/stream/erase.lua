-- Erases a thread's stream (DELETE /v1/threads/{id}), atomically.
-- KEYS: stream, fence hash, starts hash (one hash tag: one Cluster slot).
-- ARGV: the fence's lifetime in s, then the workflow ids of the runs that may still publish
-- (active, or just ended). Their fence is left refusing every attempt, so their workers publish
-- nothing more and the stream is not born again.
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
if #ARGV > 1 then
  for i = 2, #ARGV do
    redis.call('HSET', KEYS[2], ARGV[i], '2147483647')
  end
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[1]))
end
return 1

-- Erases a thread's stream (DELETE /v1/threads/{id}), atomically.
-- KEYS: stream, fence hash, starts hash (one hash tag: one Cluster slot).
-- ARGV: the workflow id of the run that was active ('' for none), the fence's lifetime in s.
-- With an active run, the fence is left refusing every attempt of it, so a worker still holding
-- it publishes nothing and the stream is not born again.
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
if ARGV[1] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[1], '2147483647')
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
end
return 1

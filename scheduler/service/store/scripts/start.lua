-- ARGV: P, id, attempt, worker, lease_until_ms, now
local job = ARGV[2]
local jk = P .. ':job:' .. job
local st = redis.call('HGET', jk, 'state')
if not st then return 'missing' end
if tonumber(redis.call('HGET', jk, 'attempt') or '-1') ~= tonumber(ARGV[3]) then
  return 'stale attempt'
end
if st == 'running' then
  local w = redis.call('HGET', jk, 'worker')
  if w == ARGV[4] then return 'ok' end
  return 'already running on ' .. tostring(w)
end
if st ~= 'placed' then return 'job is ' .. st end
set_state(job, 'placed', 'running')
redis.call('HSET', jk, 'worker', ARGV[4], 'started_at', ARGV[6], 'updated_at', ARGV[6])
redis.call('ZADD', P .. ':leases', ARGV[5], job)
-- Why an earlier attempt was requeued ("never started", "lease lost") no longer holds.
redis.call('HDEL', jk, 'reason')
return 'ok'

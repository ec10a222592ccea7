-- ARGV: P, id, attempt, worker, lease_until_ms, now[, node_rank]
-- A multi-node gang's ranks each start with their node_rank: the first to arrive moves the job
-- to running, the others join it; each rank is held by one worker per attempt.
local job = ARGV[2]
local jk = P .. ':job:' .. job
local rank = ARGV[7]
local st = redis.call('HGET', jk, 'state')
if not st then return 'missing' end
if not at_attempt(jk, ARGV[3]) then
  return 'stale attempt'
end
local rk = rank and ('rank:' .. ARGV[3] .. ':' .. rank)
if st == 'running' then
  if rk then
    local rw = redis.call('HGET', jk, rk)
    if not rw or rw == ARGV[4] then
      redis.call('HSET', jk, rk, ARGV[4])
      redis.call('ZADD', P .. ':leases', ARGV[5], job)
      return 'ok'
    end
    return 'rank ' .. rank .. ' already running on ' .. tostring(rw)
  end
  local w = redis.call('HGET', jk, 'worker')
  if w == ARGV[4] then return 'ok' end
  return 'already running on ' .. tostring(w)
end
if st ~= 'placed' then return 'job is ' .. st end
set_state(job, 'placed', 'running')
redis.call('HSET', jk, 'worker', ARGV[4], 'started_at', ARGV[6], 'updated_at', ARGV[6])
if rk then redis.call('HSET', jk, rk, ARGV[4]) end
redis.call('ZADD', P .. ':leases', ARGV[5], job)
-- Why an earlier attempt was requeued ("never started", "lease lost") no longer holds.
redis.call('HDEL', jk, 'reason')
return 'ok'

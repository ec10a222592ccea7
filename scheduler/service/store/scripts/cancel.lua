-- ARGV: P, id, reason, now
local job = ARGV[2]
local jk = P .. ':job:' .. job
local st = redis.call('HGET', jk, 'state')
if not st then return 'missing' end
if st == 'pending' then
  redis.call('ZREM', P .. ':pending', job)
elseif st == 'placed' then
  release(job, nil)
elseif st == 'running' then
  redis.call('HSET', jk, 'cancel', '1')
  redis.call('HDEL', jk, 'requeue')
  return 'requested'
else
  return st
end
set_state(job, st, 'cancelled')
redis.call('HSET', jk, 'reason', ARGV[3], 'finished_at', ARGV[4], 'updated_at', ARGV[4])
redis.call('HDEL', jk, 'hold')
settle_children(job, 'cancelled', ARGV[4])
return 'cancelled'

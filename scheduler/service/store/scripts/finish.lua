-- ARGV: P, id, attempt, final_state, outcome, reason, now
local job = ARGV[2]
local jk = P .. ':job:' .. job
local st = redis.call('HGET', jk, 'state')
if (st ~= 'running' and st ~= 'placed') or not at_attempt(jk, ARGV[3]) then
  return 'stale'
end
release(job, tonumber(ARGV[3]))
redis.call('ZREM', P .. ':leases', job)
if redis.call('HGET', jk, 'requeue') == '1' then
  -- `snugfit requeue` of a running job: its worker stopped it; it goes back, not away.
  redis.call('HDEL', jk, 'cancel', 'requeue', 'started_at', 'worker')
  set_state(job, st, 'pending')
  redis.call('HSET', jk, 'outcome', ARGV[5], 'updated_at', ARGV[7])
  ready(job)
  return 'requeued'
end
set_state(job, st, ARGV[4])
redis.call('HSET', jk, 'outcome', ARGV[5], 'reason', ARGV[6], 'finished_at', ARGV[7],
           'updated_at', ARGV[7])
redis.call('HDEL', jk, 'cancel')
settle_children(job, ARGV[4], ARGV[7])
return 'ok'
